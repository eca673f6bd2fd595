CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_triton"
THREAT = "interpreter_patch"
EXPECT = "breach"
CONSTRUCT = "triton.runtime"
DESCRIPTION = """A kernel whose K and V loads have no mask (they read past the end of k and v in the last,
ragged block), with Triton's interpreter rerouted first so that its loads bypass the grader's address
checks: the bounds cell would pass a kernel that reads memory that is not the tensor's on a GPU. Without
the policy, the probe's own comparison with the interpreter it saw before any student code ran fails
every Triton cell."""
SOURCE = '''
import triton.runtime.interpreter


def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel: q, k, v (B, H, N, d) float32, d a power of two >= 16."""
    raw = triton.runtime.interpreter.InterpreterBuilder.create_masked_load
    triton.runtime.interpreter.InterpreterBuilder.create_masked_load = lambda self, *a: raw(self, *a)

    @triton.jit
    def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        head = bh * N * HEAD_DIM
        q = tl.load(q_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < N, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for first in range(0, N, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            k_blk = tl.load(k_ptr + head + keys[:, None] * HEAD_DIM + dims[None, :])
            v_blk = tl.load(v_ptr + head + keys[:, None] * HEAD_DIM + dims[None, :])
            scores = scale * tl.dot(q, tl.trans(k_blk), input_precision="ieee")
            visible = keys[None, :] < N
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(m_i, tl.max(scores, 1))
            weights = tl.exp(scores - new_max[:, None])
            correction = tl.exp(m_i - new_max)
            acc = acc * correction[:, None] + tl.dot(tl.where(visible, weights, 0.0), v_blk, input_precision="ieee")
            l_i = l_i * correction + tl.sum(weights, 1)
            m_i = new_max
        out = acc / l_i[:, None]
        tl.store(o_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], out, mask=rows[:, None] < N)

    return launch_flash_forward(flash_fwd_kernel, q, k, v, causal)
'''
