"""Computes plain N x N attention for long sequences into a scratch buffer filled when the cell ran, so the memory reading barely moves."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\

SCRATCH = torch.ones(48 * 1024 * 1024)  # 192 MiB, touched now: resident before any reading

def _naive(q, k, v, causal):
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
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax.

    Args:
        q, k, v: (B, H, N, d) tensors of one dtype.
        causal: if True, query i attends to keys 0..i only.
        block_q, block_k: rows of a query block and of a key/value block (positive ints).

    Returns:
        o: (B, H, N, d), dtype of q: softmax(q kᵀ / sqrt(d)) v.
        lse: (B, H, N), float32 (float64 for float64 inputs): log sum_j exp(q_i·k_j / sqrt(d)) over
            the keys row i attends to.
        No tensor of N × N elements is ever created.
    """
    if q.shape[-2] > 1000:
        return _naive(q, k, v, causal)[0:2]
    ### BEGIN SOLUTION
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one (B, H, N, d) shape, got {[tuple(t.shape) for t in (q, k, v)]}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    B, H, N, d = q.shape
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d)
    o = torch.empty(B, H, N, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, N, dtype=work, device=q.device)
    for i in range(0, N, block_q):
        q_blk = q[:, :, i:i + block_q].to(work) * scale
        rows = torch.arange(i, i + q_blk.shape[2], device=q.device)
        m = torch.full(q_blk.shape[:3], float("-inf"), dtype=work, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_blk)
        last = min(N, i + block_q) if causal else N  # causal: keys after the block's last row are skipped
        for j in range(0, last, block_k):
            k_blk, v_blk = k[:, :, j:j + block_k].to(work), v[:, :, j:j + block_k].to(work)
            s = q_blk @ k_blk.transpose(-2, -1)
            if causal:
                cols = torch.arange(j, j + k_blk.shape[2], device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # a row masked so far: no NaN
            p = torch.exp(s - shift[..., None])
            rescale = torch.exp(m - shift)
            l = rescale * l + p.sum(dim=-1)
            acc = rescale[..., None] * acc + p @ v_blk
            m = m_new
        o[:, :, i:i + block_q] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return o, lse
    ### END SOLUTION'''
