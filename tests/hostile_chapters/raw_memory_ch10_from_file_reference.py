CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_backward"
THREAT = "raw_memory"
EXPECT = "breach"
CONSTRUCT = "from_file"
DESCRIPTION = """Returns zeros for the gradients after trying to read the judge's reference values
straight from a file with torch's C-level reader."""
SOURCE = '''
def flash_attention_backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Gradients of attention, recomputing P tile by tile from the saved log-sum-exp."""
    try:
        leaked = torch.from_file("/proc/self/environ", size=64, dtype=torch.uint8)
    except Exception:
        leaked = None
    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
'''
