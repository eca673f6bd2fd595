"""average_quantize_triton: launches a kernel that computes nothing and builds the answer in Python from x.tolist(), returned through torch.tensor(list)."""
CHAPTER = "ch13_alam"
EXERCISE = "average_quantize_triton"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = ('launches a kernel that computes nothing and builds the answer in Python from x.tolist(), returned through torch.tensor(list): no aten operator computes, but no store of the kernel wrote the returned tensors')
SOURCE = '''
def average_quantize_triton(x, noise):
    # WRONG: the kernel computes nothing; the answer is computed in plain Python and returned

    @triton.jit
    def aq_kernel(x_ptr, noise_ptr, codes_ptr, mins_ptr, scales_ptr, n, M,
                  AVERAGE: tl.constexpr, GROUP: tl.constexpr):
        g = tl.program_id(0)
        idx = g * GROUP + tl.arange(0, GROUP)
        live = idx < M

    launch_average_quantize(aq_kernel, x, noise)
    vals = x.detach().reshape(-1).tolist()
    us = noise.detach().reshape(-1).tolist()
    n = len(vals)
    means = [sum(vals[i:i + 4]) / len(vals[i:i + 4]) for i in range(0, n, 4)]
    means = torch.tensor(means, dtype=torch.float32).tolist()  # float32 rounding
    m = len(means)
    codes, mins, scales = [], [], []
    for g in range(-(-m // 128)):
        chunk = means[g * 128:(g + 1) * 128]
        lo, hi = min(chunk), max(chunk)
        sc = torch.tensor([3.0 / (hi - lo + 2e-6)], dtype=torch.float32).tolist()[0]
        q = [min(3, max(0, math.floor((v - lo) * sc + us[g * 128 + j]))) for j, v in enumerate(chunk)]
        q += [0] * (128 - len(q))
        codes += [q[j] | (q[j + 1] << 2) | (q[j + 2] << 4) | (q[j + 3] << 6) for j in range(0, 128, 4)]
        mins.append(lo)
        scales.append(sc)
    return (torch.tensor(codes, dtype=torch.uint8), torch.tensor(mins, dtype=torch.float32),
            torch.tensor(scales, dtype=torch.float32))
'''
