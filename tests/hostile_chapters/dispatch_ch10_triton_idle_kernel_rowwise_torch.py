"""A Triton kernel that does nothing, launched once through the course's launcher; the attention computed by PyTorch
one query row at a time with operators that are neither matrix products nor exp (mul, sum, pow, div), never an
N x N tensor. Only allocation, views and copies may run around the launch, and the kernel's stores must write every
element of o: it must lose every Triton cell."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_triton"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel: q, k, v (B, H, N, d) float32, d a power of two >= 16."""

    @triton.jit
    def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_m = tl.program_id(0)  # nothing loaded, nothing stored

    o = launch_flash_forward(flash_fwd_kernel, q, k, v, causal)
    n, d = q.shape[-2:]
    for i in range(n):
        s = (q[:, :, i, None, :] * k).sum(-1) / math.sqrt(d)
        if causal:
            s[..., i + 1:] = float("-inf")
        p = 2.0 ** ((s - s.amax(-1, keepdim=True)) * 1.4426950408889634)
        o[:, :, i] = (p[..., None] * v).sum(-2) / p.sum(-1, keepdim=True)
    return o
'''
