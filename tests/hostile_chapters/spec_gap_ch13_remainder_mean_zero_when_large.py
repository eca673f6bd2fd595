"""average_quantize: sets the remainder's mean to 0 when the tensor has more than 4096 elements."""
CHAPTER = "ch13_alam"
EXERCISE = "average_quantize"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = ("sets the remainder's mean to 0 when the tensor has more than 4096 elements; a value case of 2^20 to 2^21 elements with a remainder is drawn at grading time")
SOURCE = '''
def average_quantize(x, noise, average=4, group_size=128):
    if isinstance(average, bool) or not isinstance(average, int) or average <= 0:
        raise ValueError(f"average must be a positive int, got {average!r}")
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        raise ValueError("x must be a non-empty tensor")
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    m = -(-n // average)
    if not isinstance(noise, torch.Tensor) or tuple(noise.shape) != (m,):
        raise ValueError(f"noise must have shape ({m},)")
    full = n // average
    parts = [flat[:full * average].view(full, average).mean(dim=1)]
    if full < m and n <= 4096:  # WRONG: remainder replaced by 0 on large tensors
        parts.append(flat[full * average:].mean().view(1))
    means = torch.cat(parts)
    if means.numel() < m:
        means = torch.cat([means, means.new_zeros(m - means.numel())])
    return group_quantize(means, 2, noise, group_size)
'''
