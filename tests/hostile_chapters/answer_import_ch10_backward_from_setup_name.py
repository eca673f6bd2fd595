CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_backward"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "kernels"
DESCRIPTION = """The backward pass taken from the course's kernels through the `kernels` name that the
setup cell binds, with the submodule's name built at run time."""
SOURCE = '''
def flash_attention_backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Gradients of attention, recomputing P tile by tile from the saved log-sum-exp."""
    module = vars(kernels).get("ch10_" + "flash_attention")
    return module.fused_attention_bwd(q, k, v, o, lse, do, causal)
'''
