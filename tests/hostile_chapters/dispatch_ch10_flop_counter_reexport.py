CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "dispatch"
EXPECT = "breach"
CONSTRUCT = "torch.utils.flop_counter"
DESCRIPTION = """Naive N x N attention inside a TorchDispatchMode of its own that swallows what the probe's
mode would see, with the mode class reached through a public module that re-exports it."""
SOURCE = '''
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax."""
    Mode = torch.utils.flop_counter.TorchDispatchMode

    class Quiet(Mode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Quiet():
        work = torch.promote_types(q.dtype, torch.float32)
        s = q.to(work) @ k.to(work).transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            n = q.shape[2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ v.to(work)).to(q.dtype), torch.logsumexp(s, -1)
'''
