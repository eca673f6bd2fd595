"""group_quantize: rounds to nearest (ignores the noise) when the tensor has more than 4096 elements."""
CHAPTER = "ch13_alam"
EXERCISE = "group_quantize"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = ('rounds to nearest (ignores the noise) when the tensor has more than 4096 elements; a value case of 2^20 to 2^21 elements is drawn at grading time')
SOURCE = '''
def group_quantize(x, bits, noise, group_size=128):
    if isinstance(bits, bool) or bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits!r}")
    bits = int(bits)
    per_byte = 8 // bits
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 or group_size % per_byte:
        raise ValueError(f"group_size must be a positive multiple of {per_byte}, got {group_size!r}")
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        raise ValueError("x must be a non-empty tensor")
    if not isinstance(noise, torch.Tensor) or tuple(noise.shape) != tuple(x.shape):
        raise ValueError("noise must have x's shape")
    flat = x.detach().reshape(-1).to(torch.float32)
    u = noise.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    if n > 4096:  # WRONG: round to nearest (biased) on large tensors
        u = torch.full_like(u, 0.5)
    groups = -(-n // group_size)
    pad = groups * group_size - n
    live = torch.arange(groups * group_size) < n
    vals = torch.cat([flat, flat.new_zeros(pad)]).view(groups, group_size)
    uu = torch.cat([u, u.new_zeros(pad)]).view(groups, group_size)
    live = live.view(groups, group_size)
    lo = torch.where(live, vals, torch.inf).amin(dim=1)
    hi = torch.where(live, vals, -torch.inf).amax(dim=1)
    top = 2 ** bits - 1
    scale = top / (hi - lo + 2e-6)
    q = torch.floor((vals - lo[:, None]) * scale[:, None] + uu).clamp(0, top)
    q = torch.where(live, q, torch.zeros_like(q)).to(torch.int32).view(-1, per_byte)
    packed = torch.zeros(q.shape[0], dtype=torch.int32)
    for i in range(per_byte):
        packed = packed | (q[:, i] << (i * bits))
    return packed.to(torch.uint8), lo.contiguous(), scale.contiguous()
'''
