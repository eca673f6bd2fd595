CHAPTER = "ch08_quantization"
EXERCISE = "round_to_bf16"
THREAT = "dispatch"
EXPECT = "breach"
CONSTRUCT = "torch.utils"
DESCRIPTION = """The forbidden conversion to bfloat16, done where no dispatch-mode probe can see the
_to_copy operator; the dtype is reached through a string so that no `bfloat16` attribute appears."""
SOURCE = '''
def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest bfloat16 value."""
    hide = torch.utils._python_dispatch._disable_current_modes
    with hide():
        half = x.type("torch." + "BFloat" + "16Tensor")
        return half.float()
'''
