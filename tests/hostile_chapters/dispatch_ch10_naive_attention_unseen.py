CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "dispatch"
EXPECT = "breach"
CONSTRUCT = "torch.utils._python_dispatch"
DESCRIPTION = """Naive attention (an N x N score matrix) computed inside
_disable_current_modes(), where the op trace that looks for N x N tensors sees nothing."""
SOURCE = '''
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        work = torch.promote_types(q.dtype, torch.float32)
        s = (q.to(work) @ k.to(work).transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if causal:
            n = q.shape[2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        o = (torch.softmax(s, dim=-1) @ v.to(work)).to(q.dtype)
    return o, lse
'''
