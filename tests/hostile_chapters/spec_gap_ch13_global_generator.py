"""compress_hooks: seeds torch's global generator when the pair is made and draws the noise from it."""
CHAPTER = "ch13_alam"
EXERCISE = "compress_hooks"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = ("seeds torch's global generator when the pair is made and draws the noise from it: two pairs of one seed agree only when used one after the other")
SOURCE = '''
def compress_hooks(bits_per_tensor, seed=0):
    if not isinstance(bits_per_tensor, (list, tuple)) or len(bits_per_tensor) == 0:
        raise ValueError("bits_per_tensor must be a non-empty list or tuple")
    for b in bits_per_tensor:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b not in (32, 8, 4, 2, 1, 0.5):
            raise ValueError(f"unknown precision {b!r}")
    plan = list(bits_per_tensor)
    torch.manual_seed(seed)  # WRONG: the global RNG, reseeded when the pair is made; no generator of its own
    state = {"count": 0}

    def pack(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad and not is_parameter(t)):
            return t
        b = plan[state["count"] % len(plan)]
        state["count"] += 1
        if b == 32:
            return t
        if b == 0.5:
            noise = torch.rand((-(-t.numel() // 4),))
            codes, mins, scales = average_quantize(t, noise)
        else:
            noise = torch.rand(t.shape)
            codes, mins, scales = group_quantize(t, int(b), noise, 128)
        return ("alam", codes, mins, scales, tuple(t.shape), t.dtype, b)

    def unpack(packed):
        if not isinstance(packed, tuple):
            return packed
        _, codes, mins, scales, shape, dtype, b = packed
        if b == 0.5:
            out = average_dequantize(codes, mins, scales, shape)
        else:
            out = group_dequantize(codes, mins, scales, int(b), shape, 128)
        return out.to(dtype)

    return pack, unpack
'''
