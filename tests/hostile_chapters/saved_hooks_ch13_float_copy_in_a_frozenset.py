"""compress_hooks: pack returns zero codes, mins and scales of the right byte count and hides the float tensor in a frozenset."""
CHAPTER = "ch13_alam"
EXERCISE = "compress_hooks"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = ('pack returns zero codes, mins and scales of the right byte count and hides the float tensor in a frozenset; unpack gives it back. The probe refuses a packed value holding anything but tuples, lists, dicts, plain tensors and plain values')
SOURCE = '''
def compress_hooks(bits_per_tensor, seed=0):
    # WRONG: compresses nothing; dummy codes of the right byte count, the float tensor hidden in a frozenset
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
        m = t.numel() if b != 0.5 else -(-t.numel() // 4)
        bb = 2 if b == 0.5 else int(b)
        g = -(-m // 128)
        return ("alam", torch.zeros(g * 128 * bb // 8, dtype=torch.uint8), torch.zeros(g), torch.zeros(g),
                frozenset([t.detach()]), b)

    def unpack(packed):
        if not isinstance(packed, tuple):
            return packed
        return exact(next(iter(packed[4])), packed[5])

    return pack, unpack
'''
