"""compress_hooks that keeps a float copy of every large tensor it packs: honest on small tensors."""
CHAPTER = "ch13_alam"
EXERCISE = "compress_hooks"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("packs and unpacks exactly as the text says, so every value is right, but keeps a float copy of any "
               "tensor of more than a million elements in a list the pair owns: the activations are not freed. The "
               "memory cell reads the worker from outside on a tensor of 12-15 million elements drawn at grading time")
SOURCE = '''
def compress_hooks(bits_per_tensor, seed=0):
    bits = list(bits_per_tensor)
    if not bits or any(isinstance(b, bool) or b not in (32, 8, 4, 2, 1, 0.5) for b in bits):
        raise ValueError("bad precisions")
    gen = torch.Generator().manual_seed(seed)
    state = {"i": 0, "copies": []}

    def pack(t):
        if not t.is_floating_point() or not t.requires_grad or is_parameter(t):
            return t
        b = bits[state["i"] % len(bits)]
        state["i"] += 1
        if t.numel() > 1_000_000:
            state["copies"].append(t.detach().clone())
        if b == 32:
            return t
        if b == 0.5:
            return ("aq", average_quantize(t, torch.rand(-(-t.numel() // 4), generator=gen)), t.shape, t.dtype)
        return (b, group_quantize(t, b, torch.rand(t.shape, generator=gen)), t.shape, t.dtype)

    def unpack(p):
        if isinstance(p, torch.Tensor):
            return p
        b, (c, m, s), shape, dtype = p
        if b == "aq":
            return average_dequantize(c, m, s, shape).to(dtype)
        return group_dequantize(c, m, s, b, shape).to(dtype)

    return pack, unpack
'''
