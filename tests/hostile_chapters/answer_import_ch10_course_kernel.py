CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_triton"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "kernels.ch10_flash_attention"
DESCRIPTION = """The Triton exercise answered by the course's own kernel, reached through the
`kernels` package that the setup cell imports (no import statement in the cell)."""
SOURCE = '''
def flash_attention_triton(q, k, v, causal=False, block_m=32, block_n=32):
    """Forward attention with a Triton kernel."""
    import kernels.ch10_flash_attention

    return kernels.ch10_flash_attention.fused_attention_fwd(q, k, v, causal, block_m, block_n)[0]
'''
