"""compress_hooks: hides the float tensor at 8, 4, 1 bits and AQ and compresses honestly at 2 bits, the precision the memory cell used to measure alone."""
CHAPTER = "ch13_alam"
EXERCISE = "compress_hooks"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = ('hides the float tensor at 8, 4, 1 bits and AQ and compresses honestly at 2 bits, the precision the memory cell used to measure alone')
SOURCE = '''
def compress_hooks(bits_per_tensor, seed=0):
    # WRONG: honest only at 2 bits; at 8, 4, 1 and AQ the float tensor is kept whole, hidden in a frozenset
    if not isinstance(bits_per_tensor, (list, tuple)) or len(bits_per_tensor) == 0:
        raise ValueError("bits_per_tensor must be a non-empty list or tuple")
    for b in bits_per_tensor:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b not in (32, 8, 4, 2, 1, 0.5):
            raise ValueError(f"unknown precision {b!r}")
    plan = list(bits_per_tensor)
    gen = torch.Generator().manual_seed(seed)
    state = {"count": 0}

    def exact(t, b):
        # the tensor itself, or for AQ the exact (unquantized) means of its runs of 4, repeated
        if b != 0.5:
            return t
        flat = t.reshape(-1).to(torch.float32)
        n = flat.numel()
        full = n // 4
        parts = [flat[:full * 4].view(full, 4).mean(dim=1)]
        if full * 4 < n:
            parts.append(flat[full * 4:].mean().view(1))
        return torch.cat(parts).repeat_interleave(4)[:n].view(t.shape).to(t.dtype)

    def pack(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad and not is_parameter(t)):
            return t
        b = plan[state["count"] % len(plan)]
        state["count"] += 1
        if b == 32:
            return t
        m = t.numel() if b != 0.5 else -(-t.numel() // 4)
        bb = 2 if b == 0.5 else int(b)
        g = -(-m // 128)
        if b != 2:  # WRONG: only the 2-bit precision (the one the memory cell measures) is compressed
            return ("hid", torch.zeros(g * 128 * bb // 8, dtype=torch.uint8), torch.zeros(g), torch.zeros(g),
                    frozenset([t.detach()]), b)
        noise = torch.rand(t.shape, generator=gen)
        codes, mins, scales = group_quantize(t, bb, noise, 128)
        return ("alam", codes, mins, scales, tuple(t.shape), t.dtype, bb)

    def unpack(packed):
        if not isinstance(packed, tuple):
            return packed
        if packed[0] == "hid":
            return exact(next(iter(packed[4])), packed[5])
        _, codes, mins, scales, shape, dtype, b = packed
        return group_dequantize(codes, mins, scales, b, shape, 128).to(dtype)

    return pack, unpack
'''
