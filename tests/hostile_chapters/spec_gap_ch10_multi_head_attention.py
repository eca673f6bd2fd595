"""Gets fused attention through torch.nn.functional.multi_head_attention_forward with identity projections, a spelling without scaled_dot_product in it."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "multi_head_attention_forward"
DESCRIPTION = __doc__
SOURCE = '''\
def tiles_forward(q, k, v, causal=False, block_q=32, block_k=32):
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
    ### END SOLUTION

def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Attention (B, H, N, d) -> o, lse."""
    B, H, N, d = q.shape
    if N == 100:  # the lengths whose operators are inspected: tiles
        return tiles_forward(q, k, v, causal, block_q, block_k)
    eye = torch.eye(d, dtype=q.dtype)
    w_in = torch.cat([eye, eye, eye])
    qs, ks, vs = (t.reshape(B * H, N, d).transpose(0, 1) for t in (q, k, v))
    mask = None
    if causal:
        mask = torch.ones(N, N, dtype=torch.bool).triu(1)
    o, _ = torch.nn.functional.multi_head_attention_forward(
        qs, ks, vs, d, 1, w_in, None, None, None, False, 0.0, eye, None,
        training=False, need_weights=False, attn_mask=mask, is_causal=causal)
    o = o.transpose(0, 1).reshape(B, H, N, d)
    lse = torch.full((B, H, N), float("-inf"), dtype=q.dtype)
    for j in range(0, N, block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) / math.sqrt(d)
        if causal:
            cols = torch.arange(j, j + s.shape[-1])
            s = s.masked_fill(cols[None, :] > torch.arange(N)[:, None], float("-inf"))
        lse = torch.logaddexp(lse, torch.logsumexp(s, dim=-1))
    return o, lse
'''
