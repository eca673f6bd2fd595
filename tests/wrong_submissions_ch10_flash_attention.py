"""Plausible wrong answers for chapter 10, one per exercise: each must lose points when autograded.

Each fails one property cell of its exercise: the forward's values (no rescale), the backward's
gradients (no τ), FlashAttention's memory (it also saves P) and the Triton kernel's bounds (right
values, but the K block is loaded without a mask).
"""

WRONG = {
    ("ch10_flash_attention", "flash_attention_forward"): '''
import math
import torch

def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Wrong: the running output is not rescaled when the running max grows."""
    B, H, N, d = q.shape
    o, lse = torch.empty_like(q), torch.empty(B, H, N, dtype=torch.float32)
    for i in range(0, N, block_q):
        qi = q[:, :, i:i + block_q] / math.sqrt(d)
        rows = torch.arange(i, i + qi.shape[2])
        m = torch.full(qi.shape[:3], float("-inf"))
        l, acc = torch.zeros(qi.shape[:3]), torch.zeros_like(qi)
        for j in range(0, N, block_k):
            s = qi @ k[:, :, j:j + block_k].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            l = torch.exp(m - m_new) * l + p.sum(-1)
            acc = acc + p @ v[:, :, j:j + block_k]
            m = m_new
        o[:, :, i:i + block_q] = acc / l[..., None]
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return o, lse
''',
    ("ch10_flash_attention", "flash_attention_backward"): '''
import torch

def flash_attention_backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Wrong: forgets the 1/sqrt(d) factor in dq and dk."""
    B, H, N, d = q.shape
    scale = d ** -0.5
    delta = (do * o).sum(-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(0, N, block_q):
        rows = torch.arange(i, min(i + block_q, N))
        for j in range(0, N, block_k):
            cols = torch.arange(j, min(j + block_k, N))
            s = q[:, :, i:i + block_q] @ k[:, :, j:j + block_k].transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            p = torch.exp(s - lse[:, :, i:i + block_q, None])
            dv[:, :, j:j + block_k] += p.transpose(-2, -1) @ do[:, :, i:i + block_q]
            ds = p * (do[:, :, i:i + block_q] @ v[:, :, j:j + block_k].transpose(-2, -1) - delta[:, :, i:i + block_q, None])
            dq[:, :, i:i + block_q] += ds @ k[:, :, j:j + block_k]
            dk[:, :, j:j + block_k] += ds.transpose(-2, -1) @ q[:, :, i:i + block_q]
    return dq, dk, dv
''',
    ("ch10_flash_attention", "FlashAttention"): '''
import math
import torch

class FlashAttention(torch.autograd.Function):
    """Wrong: also saves the N x N probabilities for backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        o, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
        p = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None])
        ctx.save_for_backward(q, k, v, o, lse, p)
        ctx.cfg = (causal, block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, _ = ctx.saved_tensors
        return (*flash_attention_backward(q, k, v, o, lse, do, *ctx.cfg), None, None, None)
''',
    ("ch10_flash_attention", "flash_attention_triton"): '''
def flash_attention_triton(q, k, v, causal=False):
    """Wrong: the K block is loaded without a mask; its rows past N are masked out of the scores, but the
    load of the last, ragged block reads past the end of k."""

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
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            kb = tl.load(k_ptr + head + cols[:, None] * HEAD_DIM + dims[None, :])
            vb = tl.load(v_ptr + head + cols[:, None] * HEAD_DIM + dims[None, :], mask=cols[:, None] < N, other=0.0)
            s = tl.dot(q, tl.trans(kb), input_precision="ieee") * scale
            ok = cols[None, :] < N
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None])
            s = tl.where(ok, s, -1.0e30)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], out, mask=rows[:, None] < N)

    return launch_flash_forward(flash_fwd_kernel, q, k, v, causal)
''',
}
