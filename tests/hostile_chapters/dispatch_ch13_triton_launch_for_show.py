"""average_quantize_triton that launches a kernel for show and returns what torch computed."""
CHAPTER = "ch13_alam"
EXERCISE = "average_quantize_triton"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = ("launches a kernel that only stores zeros, then overwrites the outputs with the means, mins, scales and "
               "codes computed by torch operations: the values are right, the kernel does nothing. The operator trace "
               "around the launch sees torch computing")
SOURCE = '''
def average_quantize_triton(x, noise):

    @triton.jit
    def idle(x_ptr, noise_ptr, codes_ptr, mins_ptr, scales_ptr, n, M, AVERAGE: tl.constexpr, GROUP: tl.constexpr):
        g = tl.program_id(0)
        tl.store(mins_ptr + g, 0.0)
        tl.store(scales_ptr + g, 0.0)

    codes, mins, scales = launch_average_quantize(idle, x, noise)
    flat = x.reshape(-1).float()
    n = flat.numel()
    m = -(-n // 4)
    padded = torch.zeros(m * 4)
    padded[:n] = flat
    counts = torch.full((m,), 4.0)
    counts[-1] = n - 4 * (m - 1)
    means = padded.view(m, 4).sum(1) / counts
    g = -(-m // 128)
    table = torch.cat([means, means[-1:].expand(g * 128 - m)]).view(g, 128)
    lo, hi = table.amin(1), table.amax(1)
    scale = 3 / (hi - lo + 2e-6)
    u = torch.cat([noise.reshape(-1), torch.zeros(g * 128 - m)]).view(g, 128)
    q = torch.floor((table - lo[:, None]) * scale[:, None] + u).clamp(0, 3).reshape(-1)
    q[m:] = 0
    q = q.view(-1, 4).long()
    packed = q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)
    codes.copy_(packed.to(torch.uint8))
    mins.copy_(lo)
    scales.copy_(scale)
    return codes, mins, scales
'''
