CHAPTER = "ch08_quantization"
EXERCISE = "round_to_bf16"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "autocast"
DESCRIPTION = """bf16 rounding borrowed from CPU autocast (whose dtype is bfloat16) without naming the
dtype: the docstring asks for integer bit operations and no conversion to bfloat16 anywhere."""
SOURCE = '''
def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest bfloat16 value."""
    eye = torch.ones(1, 1)
    with torch.autocast("cpu"):
        rounded = (x.reshape(-1, 1) @ eye).reshape(x.shape)
    return rounded.float()
'''
