CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_triton"
THREAT = "dispatch"
EXPECT = "breach"
CONSTRUCT = "torch._C"
DESCRIPTION = """The Triton exercise answered with plain PyTorch (an N x N softmax), with torch's C-level
switch that turns the dispatch probes off."""
SOURCE = '''
def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel."""
    with torch._C._DisableTorchDispatch():
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            n = q.shape[2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v
'''
