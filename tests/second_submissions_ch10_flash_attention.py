"""Second correct answers for ch10_flash_attention, written from the released notebook alone: einsum tiles over precomputed (start, stop) spans, key-block-outer backward, exp2 with the scale folded into Q in Triton."""

SECOND = {
    ("ch10_flash_attention", "flash_attention_forward"): '''
import math

import torch


def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention, one (query block, key block) tile at a time, with the online softmax."""
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one (B, H, N, d) shape, got {[tuple(t.shape) for t in (q, k, v)]}")
    if int(block_q) < 1 or int(block_k) < 1:
        raise ValueError(f"block sizes must be positive, got {block_q} and {block_k}")
    n, d = q.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    tau = 1.0 / math.sqrt(d)
    q_spans = [(a, min(a + block_q, n)) for a in range(0, n, block_q)]
    k_spans = [(a, min(a + block_k, n)) for a in range(0, n, block_k)]

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=work, device=q.device)

    for q0, q1 in q_spans:
        q_tile = q[..., q0:q1, :].to(work) * tau
        run_max = torch.full(q_tile.shape[:-1], float("-inf"), dtype=work, device=q.device)
        run_sum = torch.zeros(q_tile.shape[:-1], dtype=work, device=q.device)
        run_out = torch.zeros(q_tile.shape, dtype=work, device=q.device)
        for k0, k1 in k_spans:
            if causal and k0 > q1 - 1:
                break  # every later key block lies after the last row of this query block
            scores = torch.einsum("bhid,bhjd->bhij", q_tile, k[..., k0:k1, :].to(work))
            if causal and k1 - 1 > q0:  # the tile crosses the diagonal
                row_ids = torch.arange(q0, q1, device=q.device)
                col_ids = torch.arange(k0, k1, device=q.device)
                scores = scores.masked_fill(col_ids[None, :] > row_ids[:, None], float("-inf"))
            new_max = torch.maximum(run_max, scores.amax(dim=-1))
            # a row with nothing seen yet keeps -inf: shift by 0 there so that no -inf - (-inf) appears
            shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)
            weights = torch.exp(scores - shift[..., None])
            decay = torch.exp(run_max - shift)
            run_sum = decay * run_sum + weights.sum(dim=-1)
            run_out = decay[..., None] * run_out + torch.einsum("bhij,bhjd->bhid", weights, v[..., k0:k1, :].to(work))
            run_max = new_max
        out[..., q0:q1, :] = (run_out / run_sum[..., None]).to(q.dtype)
        lse[..., q0:q1] = run_max + torch.log(run_sum)
    return out, lse
''',
    ("ch10_flash_attention", "flash_attention_backward"): '''
import math

import torch


def flash_attention_backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Attention gradients, recomputing P = exp(tau q k^T - L) tile by tile (key blocks outside)."""
    n, d = q.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    tau = 1.0 / math.sqrt(d)
    q_spans = [(a, min(a + block_q, n)) for a in range(0, n, block_q)]
    k_spans = [(a, min(a + block_k, n)) for a in range(0, n, block_k)]

    delta = (do.to(work) * o.to(work)).sum(dim=-1)  # D_i = dO_i . O_i, one number per row
    logz = lse.to(work)
    dq = torch.zeros(q.shape, dtype=work, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)

    for k0, k1 in k_spans:
        k_tile = k[..., k0:k1, :].to(work)
        v_tile = v[..., k0:k1, :].to(work)
        dk_acc = torch.zeros(k_tile.shape, dtype=work, device=k.device)
        dv_acc = torch.zeros(v_tile.shape, dtype=work, device=v.device)
        for q0, q1 in q_spans:
            if causal and q1 - 1 < k0:
                continue  # every row of this query block lies before the first key of the block
            q_tile = q[..., q0:q1, :].to(work)
            do_tile = do[..., q0:q1, :].to(work)
            scores = torch.einsum("bhid,bhjd->bhij", q_tile, k_tile) * tau
            if causal and k1 - 1 > q0:
                row_ids = torch.arange(q0, q1, device=q.device)
                col_ids = torch.arange(k0, k1, device=q.device)
                scores = scores.masked_fill(col_ids[None, :] > row_ids[:, None], float("-inf"))
            probs = torch.exp(scores - logz[..., q0:q1, None])  # masked entries are exactly 0
            dv_acc += torch.einsum("bhij,bhid->bhjd", probs, do_tile)
            dprobs = torch.einsum("bhid,bhjd->bhij", do_tile, v_tile)
            dscores = probs * (dprobs - delta[..., q0:q1, None])
            dq[..., q0:q1, :] += tau * torch.einsum("bhij,bhjd->bhid", dscores, k_tile)
            dk_acc += tau * torch.einsum("bhij,bhid->bhjd", dscores, q_tile)
        dk[..., k0:k1, :] = dk_acc.to(k.dtype)
        dv[..., k0:k1, :] = dv_acc.to(v.dtype)
    return dq.to(q.dtype), dk, dv
''',
    ("ch10_flash_attention", "FlashAttention"): '''
import torch


class FlashAttention(torch.autograd.Function):
    """Differentiable tiled attention: FlashAttention.apply(q, k, v, causal=False, block_q=32, block_k=32)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        o, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
        ctx.causal, ctx.block_q, ctx.block_k = bool(causal), int(block_q), int(block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, grad_o.contiguous(), ctx.causal,
                                              ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None
''',
    ("ch10_flash_attention", "flash_attention_triton"): '''
import math

import torch
import triton
import triton.language as tl


def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel (online softmax in base 2, scale folded into the queries)."""

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
        # scores in log2 units: exp(x) = exp2(x * log2(e)), so fold scale * log2(e) into q once
        q_scaled = q * (scale * 1.4426950408889634)
        offs_n = tl.arange(0, BLOCK_N)
        if CAUSAL:
            stop = tl.minimum(N, (pid_m + 1) * BLOCK_M)  # keys after this block's last row are never needed
        else:
            stop = N
        for start in range(0, stop, BLOCK_N):
            keys = start + offs_n
            in_range = keys < N
            kv_offsets = head + keys[:, None] * HEAD_DIM + dims[None, :]
            k_blk = tl.load(k_ptr + kv_offsets, mask=in_range[:, None], other=0.0)
            v_blk = tl.load(v_ptr + kv_offsets, mask=in_range[:, None], other=0.0)
            s = tl.dot(q_scaled, tl.trans(k_blk), input_precision="ieee")
            keep = in_range[None, :]
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v_blk, input_precision="ieee")
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], out, mask=rows[:, None] < N)

    return launch_flash_forward(flash_fwd_kernel, q, k, v, causal)
''',
}
