"""compress_hooks: the codes are a uint8 view of the first bytes of a float64 copy of the tensor."""
CHAPTER = "ch13_alam"
EXERCISE = "compress_hooks"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = ("the codes are a uint8 view of the first bytes of a float64 copy of the tensor: a clone of the view has the right byte count, the storage behind it is 8 bytes an element. The probe counts each storage's real size")
SOURCE = '''
def compress_hooks(bits_per_tensor, seed=0):
    # WRONG: keeps the whole float32 tensor; the tuple's first tensor is a uint8 view of its first K bytes,
    # K = the compressed size, and the full float tensor is a second view of the same storage
    if not isinstance(bits_per_tensor, (list, tuple)) or len(bits_per_tensor) == 0:
        raise ValueError("bits_per_tensor must be a non-empty list or tuple")
    for b in bits_per_tensor:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b not in (32, 8, 4, 2, 1, 0.5):
            raise ValueError(f"unknown precision {b!r}")
    plan = list(bits_per_tensor)
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
        keep = t.detach().to(torch.float64).reshape(-1).clone()
        want = compressed_bits(t.numel(), b) // 8
        head = keep.view(torch.uint8)[:want]
        return ("v", head, keep, tuple(t.shape), t.dtype, b)

    def unpack(packed):
        if not isinstance(packed, tuple):
            return packed
        return exact(packed[2].view(packed[3]).to(packed[4]), packed[5])

    return pack, unpack
'''
