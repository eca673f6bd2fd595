"""Gradients by plain autograd through N x N attention below N = 128, zeros from N = 128 on (the gate's traced
calls and the memory call): it must lose all three backward cells, whose rule-grading calls compare gradients."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_backward"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def flash_attention_backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Gradients of attention, recomputing P tile by tile from the saved log-sum-exp."""
    n, d = q.shape[-2:]
    if n >= 128:  # the sizes where a trace or the memory is read: nothing to see
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    work = torch.promote_types(q.dtype, torch.float32)
    leaves = [t.detach().to(work).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        s = leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(s, dim=-1) @ leaves[2]
        grads = torch.autograd.grad(out, leaves, do.to(work))
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
'''
