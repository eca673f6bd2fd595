"""Returns a (K, 1, 1) tensor where an (out, in) weight is expected: a judge that compared it with
torch.allclose before checking its shape would broadcast it to K x out x in and run out of memory,
failing every submission graded in the same process. Fetched values are compared only after their
shapes match."""
CHAPTER = "ch08_quantization"
EXERCISE = "nf4_dequantize"
THREAT = "harm_others"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def nf4_dequantize(packed, absmax, shape, block_size=64):
    """A tensor that broadcasts against anything."""
    return torch.zeros(400_000, 1, 1)
'''
