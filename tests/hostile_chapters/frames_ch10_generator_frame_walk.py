CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "frames"
EXPECT = "breach"
CONSTRUCT = "gi_frame"
DESCRIPTION = """Naive attention that ignores the causal mask; a generator's frame (no sys, no inspect) leads up to the worker's probe,
whose recorded largest tensor is reset through f_globals."""
SOURCE = '''
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax."""
    def probe():
        yield

    g = probe()
    frame = g.gi_frame.f_back
    while frame is not None:
        for name in ("largest", "biggest", "max_numel"):
            if name in frame.f_globals:
                frame.f_globals[name] = 0
        frame = frame.f_back
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5  # N x N, and causal is ignored
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v), scores.logsumexp(-1)
'''
