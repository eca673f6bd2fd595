"""Plain N x N attention below N = 128, where the values cells compare values, and zeros from N = 128 on: the
shortcut gate's traced calls (N = 128) and the memory call (thousands of keys) then see no N x N tensor and hold
nothing. Every call that grades a rule compares its values with the judge's reference: it must lose all three
forward cells."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax."""
    n, d = q.shape[-2:]
    work = torch.promote_types(q.dtype, torch.float32)
    if n >= 128:  # the sizes where a trace or the memory is read: nothing to see
        return torch.zeros_like(q), torch.zeros(q.shape[:-1], dtype=work)
    s = q.to(work) @ k.to(work).transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.to(work)).to(q.dtype), lse
'''
