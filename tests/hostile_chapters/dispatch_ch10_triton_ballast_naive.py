"""Lets PyTorch compute N x N attention for long sequences instead of the kernel, freeing a buffer held since the cell ran to cover the peak."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_triton"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\

SCRATCH = torch.ones(48 * 1024 * 1024)  # 192 MiB, touched now: resident before any reading

BALLAST = [torch.ones(16 * 1024 * 1024)]  # 64 MiB, resident before the reading

def _naive(q, k, v, causal):
    BALLAST.clear()  # give 64 MiB back for the call's temporaries
    n, d = q.shape[-2:]
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=q.dtype)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = SCRATCH[: n * n].view(n, n)
            torch.matmul(q[b, h], k[b, h].transpose(0, 1), out=s)
            s.mul_(1.0 / math.sqrt(d))
            if causal:
                cols = torch.arange(n)
                for r in range(0, n, 64):
                    rows = torch.arange(r, min(n, r + 64))
                    s[r:r + 64].masked_fill_(cols[None, :] > rows[:, None], float("-inf"))
            m = s.amax(dim=-1)
            s.sub_(m[:, None]).exp_()
            l = s.sum(dim=-1)
            o[b, h] = (s @ v[b, h]) / l[:, None]
            lse[b, h] = m + torch.log(l)
    return o, lse
def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel: q, k, v (B, H, N, d) float32, d a power of two >= 16.

    Returns o (B, H, N, d) = softmax(q kᵀ / sqrt(d)) v, causal if asked. Runs compiled on a GPU and
    in Triton's interpreter on a CPU (blocks of 32 × 32).
    """
    if q.shape[-2] > 500:
        return _naive(q, k, v, causal)[0]

    @triton.jit
    def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's query rows
        dims = tl.arange(0, HEAD_DIM)
        head = bh * N * HEAD_DIM  # where head bh starts in every (B, H, N, d) tensor
        q = tl.load(q_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < N, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of each row
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(s - m_i)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running unnormalised output
        ### BEGIN SOLUTION
        end = N
        if CAUSAL:
            end = tl.minimum(N, pid_m * BLOCK_M + BLOCK_M)  # later key blocks are entirely masked
        for first in range(0, end, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            k_blk = tl.load(k_ptr + head + keys[:, None] * HEAD_DIM + dims[None, :], mask=keys[:, None] < N, other=0.0)
            v_blk = tl.load(v_ptr + head + keys[:, None] * HEAD_DIM + dims[None, :], mask=keys[:, None] < N, other=0.0)
            scores = scale * tl.dot(q, tl.trans(k_blk), input_precision="ieee")
            visible = keys[None, :] < N
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(m_i, tl.max(scores, 1))
            weights = tl.exp(scores - new_max[:, None])
            correction = tl.exp(m_i - new_max)
            acc = acc * correction[:, None] + tl.dot(weights, v_blk, input_precision="ieee")
            l_i = l_i * correction + tl.sum(weights, 1)
            m_i = new_max
        ### END SOLUTION
        out = acc / l_i[:, None]
        tl.store(o_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], out, mask=rows[:, None] < N)

    return launch_flash_forward(flash_fwd_kernel, q, k, v, causal)'''
