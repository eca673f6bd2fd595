CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "numpy"
DESCRIPTION = """The N x N score matrix built in NumPy, where the operator trace cannot see it: the text
forbids any N x N tensor and refuses NumPy in this chapter."""
SOURCE = '''
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax."""
    qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
    s = qn @ kn.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        for i in range(n):
            s[..., i, i + 1:] = float("-inf")
    m = s.max(-1, keepdims=True)
    e = math.e ** (s - m)
    lse = torch.from_numpy(m[..., 0]) + torch.from_numpy(e.sum(-1)).log()
    o = torch.from_numpy((e / e.sum(-1, keepdims=True)) @ vn)
    return o.to(q.dtype), lse.float()
'''
