CHAPTER = "ch08_quantization"
EXERCISE = "nf4_dequantize"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "kernels.ch08_quantization"
DESCRIPTION = """nf4_dequantize answered by the course's Triton kernel module, which the docstring
refuses."""
SOURCE = '''
from kernels import ch08_quantization as k08


def nf4_dequantize(packed, absmax, shape, block_size=64):
    """Undo nf4_quantize: codebook level of each code times its block's absmax."""
    return k08.nf4_decode_torch(packed, absmax, nf4_codebook(), shape, block_size)
'''
