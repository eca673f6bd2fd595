"""The attention computed by PyTorch, row by row without matrix products or exp, then copied into o by a Triton
kernel whose stores do write every element of o: the kernel loads a tensor that is not q, k or v, and PyTorch
computes around the launch. It must lose every Triton cell."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_triton"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel: q, k, v (B, H, N, d) float32, d a power of two >= 16."""

    @triton.jit
    def copy_kernel(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < numel, other=0.0), mask=offs < numel)

    n, d = q.shape[-2:]
    src = torch.empty_like(q)
    for i in range(n):
        s = (q[:, :, i, None, :] * k).sum(-1) / math.sqrt(d)
        if causal:
            s[..., i + 1:] = float("-inf")
        p = 2.0 ** ((s - s.amax(-1, keepdim=True)) * 1.4426950408889634)
        src[:, :, i] = (p[..., None] * v).sum(-2) / p.sum(-1, keepdim=True)
    o = torch.empty_like(q)
    copy_kernel[(triton.cdiv(q.numel(), 1024),)](src, o, q.numel(), BLOCK=1024)
    return o
'''
