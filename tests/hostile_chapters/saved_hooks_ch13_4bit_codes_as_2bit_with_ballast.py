"""compress_hooks: at 2 bits keeps 4-bit codes (n / 4 bytes more) and frees 3 MiB of ballast at each pack."""
CHAPTER = "ch13_alam"
EXERCISE = "compress_hooks"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = ("at 2 bits keeps 4-bit codes (n / 4 bytes more) and frees 3 MiB of ballast at each pack; the memory cell's tensor is now large enough that the extra exceeds what ballast can hide, and its values are compared with the judge's 2-bit quantization under the pair's noise")
SOURCE = '''
def compress_hooks(bits_per_tensor, seed=0):
    if not isinstance(bits_per_tensor, (list, tuple)) or len(bits_per_tensor) == 0:
        raise ValueError("bits_per_tensor must be a non-empty list or tuple")
    for b in bits_per_tensor:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b not in (32, 8, 4, 2, 1, 0.5):
            raise ValueError(f"unknown precision {b!r}")
    plan = list(bits_per_tensor)
    gen = torch.Generator().manual_seed(seed)
    state = {"count": 0}
    ballast = []  # WRONG: memory held between calls, freed by pack, taken again by unpack
    BALLAST_BYTES = 3 * 2**20

    def pack(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad and not is_parameter(t)):
            return t
        b = plan[state["count"] % len(plan)]
        state["count"] += 1
        if b == 32:
            return t
        ballast.clear()
        if b == 2:  # WRONG: stores 4-bit codes; the 2-bit-sized "codes" is a view of their first bytes
            noise = torch.rand(t.shape, generator=gen)
            codes4, mins, scales = group_quantize(t, 4, noise, 128)
            view2 = codes4[:mins.numel() * 32]
            return ("d4", view2, mins, scales, codes4, tuple(t.shape), t.dtype)
        if b == 0.5:
            noise = torch.rand((-(-t.numel() // 4),), generator=gen)
            codes, mins, scales = average_quantize(t, noise)
        else:
            noise = torch.rand(t.shape, generator=gen)
            codes, mins, scales = group_quantize(t, int(b), noise, 128)
        return ("alam", codes, mins, scales, tuple(t.shape), t.dtype, b)

    def unpack(packed):
        if BALLAST_BYTES and not ballast:
            ballast.append(torch.ones(BALLAST_BYTES // 4))
        if not isinstance(packed, tuple):
            return packed
        if packed[0] == "d4":
            return group_dequantize(packed[4], packed[2], packed[3], 4, packed[5], 128).to(packed[6])
        _, codes, mins, scales, shape, dtype, b = packed
        if b == 0.5:
            out = average_dequantize(codes, mins, scales, shape)
        else:
            out = group_dequantize(codes, mins, scales, int(b), shape, 128)
        return out.to(dtype)

    return pack, unpack
'''
