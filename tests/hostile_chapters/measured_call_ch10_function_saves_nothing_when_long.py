"""FlashAttention that saves q, k, v, o and lse on the short sequences where saved tensors are counted, nothing on
long ones (where the memory is read from outside), and then returns zero gradients: the memory cell back-propagates
through the call it measured and compares the gradients, so it must lose test_FlashAttention_memory."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "FlashAttention"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
class FlashAttention(torch.autograd.Function):
    """Differentiable tiled attention: FlashAttention.apply(q, k, v, causal=False, block_q=32, block_k=32)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        o, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
        if q.shape[-2] <= 1000:  # long sequences keep nothing for backward
            ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return o

    @staticmethod
    def backward(ctx, do):
        if not ctx.saved_tensors:
            return torch.zeros_like(do), torch.zeros_like(do), torch.zeros_like(do), None, None, None
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None
'''
