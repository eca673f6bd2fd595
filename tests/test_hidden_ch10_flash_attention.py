"""Chapter 10's hidden tests: correct implementations pass, plausible wrong ones fail, in-kernel and sandboxed.

The correct family here differs from the solution on purpose: FlashAttention-1 loop order (key blocks
outside, a running state per query row updated in place), the block-local max merged into the running
one, padding to whole blocks with explicit masks, and a Triton kernel without block skipping. Each
wrong variant fails the cell of the property it gets wrong, with the hint of that property, and
passes the other cells of its exercise that do not grade what it gets wrong (at autograde the further
cells of an exercise count once its first passes, ``grader.api.gates``; in-kernel, as here, every check
runs on its own). Every call that grades a rule (a gate, a memory reading) compares its values too, so a
variant with wrong values (no rescale, no τ) also fails the memory cells here; at autograde they wait on
the values cell anyway. Answers that compute only where nothing but values is read (naive below the gate's
N = 128, zeros on the memory cells' long sequences, PyTorch around an idle Triton kernel) fail there.
"""
import math

import pytest
import torch

import kernels  # noqa: F401 - before triton
import triton
import triton.language as tl
from grader.api import LocalNamespace, checks_for
from sandbox_checks import sandbox_tests
from contract_tables import Clause, contract_tests
from wrong_submissions_ch10_flash_attention import WRONG

CHAPTER = "ch10_flash_attention"
CHECKS = checks_for(CHAPTER)
FORWARD_IDS = ("test_flash_attention_forward", "test_flash_attention_forward_edge_cases",
               "test_flash_attention_forward_memory")
BACKWARD_IDS = ("test_flash_attention_backward", "test_flash_attention_backward_edge_cases",
                "test_flash_attention_backward_memory")
FUNCTION_IDS = ("test_FlashAttention", "test_FlashAttention_memory")
TRITON_IDS = ("test_flash_attention_triton", "test_flash_attention_triton_memory", "test_flash_attention_triton_bounds")
GRADE_IDS = FORWARD_IDS + BACKWARD_IDS + FUNCTION_IDS + TRITON_IDS
NEG = float("-inf")
LONG = 1000  # "long" variants switch to what is wrong above this N: only the memory cells use such lengths


# --- forward: FlashAttention-1 order, a family of pitfalls behind flags ----------------------------
def make_forward(rescale=True, guard=True, causal_shift=0, materialise=None, pad_mask=True, local_max=False,
                 keep_dtype=True):
    def forward(q, k, v, causal=False, block_q=32, block_k=32):
        B, H, N, d = q.shape
        out_dtype = q.dtype
        work = torch.promote_types(q.dtype, torch.float32) if keep_dtype else torch.float32
        q, k, v = q.to(work), k.to(work), v.to(work)
        if materialise == "always" or (materialise == "long" and N > LONG):  # the whole N × N score matrix
            full = torch.einsum("bhid,bhjd->bhij", q, k)
        else:
            full = None
        tau = d ** -0.5
        pad = (-N) % block_k if not pad_mask else 0
        kp = torch.nn.functional.pad(k, (0, 0, 0, pad))
        vp = torch.nn.functional.pad(v, (0, 0, 0, pad))
        m = torch.full((B, H, N), NEG, dtype=work)
        l = torch.zeros(B, H, N, dtype=work)
        acc = torch.zeros(B, H, N, d, dtype=work)
        for j in range(0, kp.shape[2], block_k):
            kj, vj = kp[:, :, j:j + block_k], vp[:, :, j:j + block_k]
            cols = torch.arange(j, j + kj.shape[2])
            for i in range(0, N, block_q):
                rows = torch.arange(i, min(i + block_q, N))
                if full is not None:
                    s = full[:, :, i:i + block_q, j:j + block_k] * tau
                else:
                    s = q[:, :, i:i + block_q] @ kj.mT * tau
                if causal:
                    s = s.masked_fill(cols[None, :] > rows[:, None] + causal_shift, NEG)
                sl = slice(i, i + len(rows))
                if local_max:  # FA1 merge: block max, block sum, then combine
                    mb = s.amax(-1)
                    pb = torch.exp(s - mb[..., None])
                    m_new = torch.maximum(m[:, :, sl], mb)
                    a, b = torch.exp(m[:, :, sl] - m_new), torch.exp(mb - m_new)
                    l[:, :, sl] = a * l[:, :, sl] + b * pb.sum(-1)
                    acc[:, :, sl] = a[..., None] * acc[:, :, sl] + b[..., None] * (pb @ vj)
                    m[:, :, sl] = m_new
                    continue
                m_new = torch.maximum(m[:, :, sl], s.amax(-1))
                ref = torch.where(m_new == NEG, torch.zeros_like(m_new), m_new) if guard else m_new
                p = torch.exp(s - ref[..., None])
                a = torch.exp(m[:, :, sl] - ref) if rescale else torch.ones_like(ref)
                l[:, :, sl] = a * l[:, :, sl] + p.sum(-1)
                acc[:, :, sl] = a[..., None] * acc[:, :, sl] + p @ vj
                m[:, :, sl] = m_new
        o = acc / l[..., None]
        return (o.to(out_dtype) if keep_dtype else o), m + l.log()

    return forward


def forward_reversed(q, k, v, causal=False, block_q=32, block_k=32):
    """Key blocks from last to first with the running-max update, no guard: NaN on masked rows."""
    B, H, N, d = q.shape
    o, lse = torch.empty_like(q), torch.empty(B, H, N)
    for i in range(0, N, block_q):
        qi = q[:, :, i:i + block_q] / math.sqrt(d)
        rows = torch.arange(i, i + qi.shape[2])
        m, l, acc = torch.full(qi.shape[:3], NEG), torch.zeros(qi.shape[:3]), torch.zeros_like(qi)
        for j in reversed(range(0, N, block_k)):
            s = qi @ k[:, :, j:j + block_k].mT
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows[:, None], NEG)
            m_new = torch.maximum(m, s.amax(-1))
            a, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
            l, acc, m = a * l + p.sum(-1), a[..., None] * acc + p @ v[:, :, j:j + block_k], m_new
        o[:, :, i:i + block_q], lse[:, :, i:i + block_q] = acc / l[..., None], m + l.log()
    return o, lse


def forward_rows_only(q, k, v, causal=False, block_q=32, block_k=32):
    """Blocks over queries only: each query block is scored against all N keys at once (a plain softmax
    per block of rows, no online softmax): right values, no N × N tensor, but a whole row of tiles."""
    B, H, N, d = q.shape
    work = torch.promote_types(q.dtype, torch.float32)
    o, lse = torch.empty_like(q), torch.empty(B, H, N, dtype=work)
    keys = torch.arange(N)
    for i in range(0, N, block_q):
        s = q[:, :, i:i + block_q].to(work) @ k.to(work).mT / math.sqrt(d)
        if causal:
            s = s.masked_fill(keys[None, :] > torch.arange(i, i + s.shape[2])[:, None], NEG)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        o[:, :, i:i + block_q] = (p @ v.to(work) / l).to(q.dtype)
        lse[:, :, i:i + block_q] = (m + l.log()).squeeze(-1)
    return o, lse


def backward_columns_only(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Blocks over keys only: each key block against all N queries at once: right gradients, no N × N
    tensor, but a whole column of tiles."""
    B, H, N, d = q.shape
    tau = 1 / math.sqrt(d)
    D = (do * o).sum(-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    rows = torch.arange(N)
    for j in range(0, N, block_k):
        kj, vj = k[:, :, j:j + block_k], v[:, :, j:j + block_k]
        p = torch.exp(q @ kj.mT * tau - lse[..., None])
        if causal:
            p = p.masked_fill(torch.arange(j, j + kj.shape[2])[None, :] > rows[:, None], 0.0)
        dv[:, :, j:j + block_k] = p.mT @ do
        ds = p * (do @ vj.mT - D[..., None])
        dq += tau * ds @ kj
        dk[:, :, j:j + block_k] = tau * ds.mT @ q
    return dq, dk, dv


def forward_sdpa(q, k, v, causal=False, block_q=32, block_k=32):
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = (q @ k.mT) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), NEG)
    return o, s.logsumexp(-1)


def forward_unnormalised(q, k, v, causal=False, block_q=32, block_k=32):
    o, lse = make_forward()(q, k, v, causal, block_q, block_k)
    return o * torch.exp(lse)[..., None] / 10, lse


# --- backward: a family ---------------------------------------------------------------------------
def make_backward(tau_in_grads=True, delta="o", causal_shift=0, materialise=None, floor_blocks=False,
                  keep_dtype=True):
    def backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
        if not keep_dtype:  # computes and returns float32 whatever comes in
            q, k, v, o, lse, do = (t.float() for t in (q, k, v, o, lse, do))
        B, H, N, d = q.shape
        tau = 1 / math.sqrt(d)
        if delta == "o":
            D = (do * o).sum(-1)
        elif delta == "unnormalised":  # rowsum(dO ∘ Õ) with Õ = Σ_j exp(S_ij) V_j
            D = (do * o * torch.exp(lse)[..., None]).sum(-1)
        else:
            D = torch.zeros(B, H, N, dtype=lse.dtype)
        if materialise == "always" or (materialise == "long" and N > LONG):
            p_full = torch.exp(q @ k.mT * tau - lse[..., None])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        g = tau if tau_in_grads else 1.0
        q_end = N - N % block_q if floor_blocks else N  # drops the short last blocks
        k_end = N - N % block_k if floor_blocks else N
        for i in range(0, q_end, block_q):
            rows = torch.arange(i, min(i + block_q, N))
            for j in range(0, k_end, block_k):
                cols = torch.arange(j, min(j + block_k, N))
                qi, kj, vj, doi = q[:, :, i:i + block_q], k[:, :, j:j + block_k], v[:, :, j:j + block_k], do[:, :, i:i + block_q]
                if materialise == "always" or (materialise == "long" and N > LONG):
                    p = p_full[:, :, i:i + block_q, j:j + block_k]
                else:
                    p = torch.exp(qi @ kj.mT * tau - lse[:, :, i:i + block_q, None])
                if causal:
                    p = p.masked_fill(cols[None, :] > rows[:, None] + causal_shift, 0.0)
                dv[:, :, j:j + block_k] += p.mT @ doi
                ds = p * (doi @ vj.mT - D[:, :, i:i + block_q, None])
                dq[:, :, i:i + block_q] += g * ds @ kj
                dk[:, :, j:j + block_k] += g * ds.mT @ qi
        return dq, dk, dv

    return backward


# --- the autograd Function ------------------------------------------------------------------------
def make_function(fwd, bwd, save="exact", all_inputs=True):
    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
            o, lse = fwd(q, k, v, causal, block_q, block_k)
            if save == "exact":
                ctx.save_for_backward(q, k, v, o, lse)
            elif save == "probabilities":  # also keeps P, the N × N matrix
                p = torch.exp(q @ k.mT / math.sqrt(q.shape[-1]) - lse[..., None])
                ctx.save_for_backward(q, k, v, o, lse, p)
            elif save == "stash":  # keeps P on ctx, where saved-tensor hooks never see it
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.p = torch.exp(q @ k.mT / math.sqrt(q.shape[-1]) - lse[..., None])
            elif save == "no_lse":  # recomputes lse in backward instead
                ctx.save_for_backward(q, k, v, o)
            ctx.args = (causal, block_q, block_k)
            return o

        @staticmethod
        def backward(ctx, do):
            if save == "no_lse":
                q, k, v, o = ctx.saved_tensors
                _, lse = fwd(q, k, v, *ctx.args)
            else:
                q, k, v, o, lse = ctx.saved_tensors[:5]
            causal, bq, bk = ctx.args
            grads = bwd(q, k, v, o, lse, do, causal, bq, bk)
            return (*grads, None, None, None) if all_inputs else grads  # one per input of forward, or not

    return FlashAttention


class FunctionIgnoringCausal(torch.autograd.Function):
    """Passes causal to forward but not to backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        o, lse = make_forward()(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.blocks = (block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do):
        return (*make_backward()(*ctx.saved_tensors, do, False, *ctx.blocks), None, None, None)


# --- Triton: an independent kernel (no block skipping, exp2), and wrong ones ------------------------
def make_triton(variant="ok"):
    def flash_attention_triton(q, k, v, causal=False):
        if variant == "torch" or (variant == "torch_long" and q.shape[-2] > LONG // 2):
            s = q @ k.mT / math.sqrt(q.shape[-1])
            if causal:
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), NEG)
            return torch.softmax(s, -1) @ v

        @triton.jit
        def kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, RESCALE: tl.constexpr, SHIFT: tl.constexpr,
                   MASK_Q: tl.constexpr, MASK_K: tl.constexpr, MASK_V: tl.constexpr, MASK_O: tl.constexpr):
            i = tl.program_id(0)
            off = tl.program_id(1) * N * HEAD_DIM
            r = i * BLOCK_M + tl.arange(0, BLOCK_M)
            c = tl.arange(0, HEAD_DIM)
            if MASK_Q:
                qb = tl.load(q_ptr + off + r[:, None] * HEAD_DIM + c[None, :], mask=r[:, None] < N, other=0.0)
            else:
                qb = tl.load(q_ptr + off + r[:, None] * HEAD_DIM + c[None, :])
            mx = tl.zeros([BLOCK_M], tl.float32) - float("inf")
            den = tl.zeros([BLOCK_M], tl.float32)
            num = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            for j in range(0, N, BLOCK_N):
                cc = j + tl.arange(0, BLOCK_N)
                if MASK_K:
                    kb = tl.load(k_ptr + off + cc[:, None] * HEAD_DIM + c[None, :], mask=cc[:, None] < N, other=0.0)
                else:  # masked out of the scores below, but the load itself runs past the end of k
                    kb = tl.load(k_ptr + off + cc[:, None] * HEAD_DIM + c[None, :])
                if MASK_V:
                    vb = tl.load(v_ptr + off + cc[:, None] * HEAD_DIM + c[None, :], mask=cc[:, None] < N, other=0.0)
                else:
                    vb = tl.load(v_ptr + off + cc[:, None] * HEAD_DIM + c[None, :])
                x = tl.dot(qb, tl.trans(kb), input_precision="ieee") * (scale * 1.4426950408889634)
                ok = cc[None, :] < N
                if CAUSAL:
                    ok = ok & (cc[None, :] <= r[:, None] + SHIFT)
                x = tl.where(ok, x, float("-inf"))
                mn = tl.maximum(mx, tl.max(x, 1))
                w = tl.exp2(x - mn[:, None])
                f = tl.exp2(mx - mn)
                if RESCALE:
                    num = num * f[:, None]
                num += tl.dot(w, vb, input_precision="ieee")
                den = den * f + tl.sum(w, 1)
                mx = mn
            if MASK_O:
                tl.store(o_ptr + off + r[:, None] * HEAD_DIM + c[None, :], num / den[:, None], mask=r[:, None] < N)
            else:
                tl.store(o_ptr + off + r[:, None] * HEAD_DIM + c[None, :], num / den[:, None])

        q, k, v = (t.contiguous() for t in (q, k, v))
        B, H, N, d = q.shape
        o = torch.empty_like(q)
        kernel[(triton.cdiv(N, 32), B * H)](q, k, v, o, N, d ** -0.5, HEAD_DIM=d, BLOCK_M=32, BLOCK_N=32,
                                            CAUSAL=causal, RESCALE=variant != "no_rescale",
                                            SHIFT=1 if variant == "causal_off_by_one" else 0,
                                            MASK_Q=variant != "unmasked_q", MASK_K=variant != "unmasked_k",
                                            MASK_V=variant != "unmasked_v", MASK_O=variant != "unmasked_store")
        return o

    return flash_attention_triton


# --- answers that compute only where nothing but values is read ----------------------------------
def _naive(q, k, v, causal):
    s = q @ k.mT / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), NEG)
    lse = s.logsumexp(-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def forward_naive_below_gate(q, k, v, causal=False, block_q=32, block_k=32):
    """Plain N × N attention below N = 128 (where values are compared), zeros from N = 128 on (the gate's
    traced calls and the memory call, where a trace or the memory is read)."""
    if q.shape[2] >= 128:
        return torch.zeros_like(q), torch.zeros(q.shape[:3])
    return _naive(q, k, v, causal)


def forward_zeros_when_long(q, k, v, causal=False, block_q=32, block_k=32):
    if q.shape[2] > LONG:
        return torch.zeros_like(q), torch.zeros(q.shape[:3])
    return make_forward()(q, k, v, causal, block_q, block_k)


def backward_naive_below_gate(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    if q.shape[2] >= 128:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        return torch.autograd.grad(_naive(q, k, v, causal)[0], (q, k, v), do)


def backward_zeros_when_long(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    if q.shape[2] > LONG:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    return make_backward()(q, k, v, o, lse, do, causal, block_q, block_k)


class FunctionSavingNothingWhenLong(torch.autograd.Function):
    """Saves nothing for backward on long sequences (so the memory reading stays low) and gives zero
    gradients there."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        o, lse = make_forward()(q, k, v, causal, block_q, block_k)
        if q.shape[2] <= LONG:
            ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do):
        if not ctx.saved_tensors:
            return torch.zeros_like(do), torch.zeros_like(do), torch.zeros_like(do), None, None, None
        return (*make_backward()(*ctx.saved_tensors, do, *ctx.args), None, None, None)


def triton_rowwise_torch(q, k, v, causal=False):
    """A kernel that does nothing, launched once; the attention computed by PyTorch one row at a time with
    operators that are neither matrix products nor exp (mul, sum, pow, div)."""
    @triton.jit
    def kernel(o_ptr, N):
        pass

    B, H, N, d = q.shape
    o = torch.empty_like(q)
    kernel[(1,)](o, N)
    for i in range(N):
        s = (q[:, :, i, None, :] * k).sum(-1) / math.sqrt(d)
        if causal:
            s[..., i + 1:] = NEG
        p = 2.0 ** ((s - s.amax(-1, keepdim=True)) * 1.4426950408889634)
        o[:, :, i] = (p[..., None] * v).sum(-2) / p.sum(-1, keepdim=True)
    return o


def triton_copier(q, k, v, causal=False):
    """The attention computed by PyTorch (row by row), then copied into o by a kernel that stores every
    element: the kernel loads a tensor that is not q, k or v."""
    @triton.jit
    def copy(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < numel), mask=offs < numel)

    B, H, N, d = q.shape
    src = torch.empty_like(q)
    for i in range(N):
        s = (q[:, :, i, None, :] * k).sum(-1) / math.sqrt(d)
        if causal:
            s[..., i + 1:] = NEG
        p = 2.0 ** ((s - s.amax(-1, keepdim=True)) * 1.4426950408889634)
        src[:, :, i] = (p[..., None] * v).sum(-2) / p.sum(-1, keepdim=True)
    o = torch.empty_like(q)
    copy[(triton.cdiv(q.numel(), 1024),)](src, o, q.numel(), BLOCK=1024)
    return o


def triton_first_block_when_long(q, k, v, causal=False):
    """On long sequences the kernel runs for the first query block only and PyTorch computes the other rows."""
    if q.shape[2] <= LONG // 2:
        return make_triton()(q, k, v, causal)
    full = make_triton()(q[:, :, :32], k[:, :, :32], v[:, :, :32], causal)  # launched on 32 rows only
    o = torch.empty_like(q)
    o[:, :, :32] = full
    for i in range(32, q.shape[2]):
        s = (q[:, :, i, None, :] * k).sum(-1) / math.sqrt(q.shape[-1])
        if causal:
            s[..., i + 1:] = NEG
        o[:, :, i] = (torch.softmax(s, -1)[..., None] * v).sum(-2)
    return o


def namespace(**overrides) -> LocalNamespace:
    ns = {"flash_attention_forward": make_forward(), "flash_attention_backward": make_backward(),
          "flash_attention_triton": make_triton()}
    ns.update(overrides)
    ns.setdefault("FlashAttention", make_function(ns["flash_attention_forward"], ns["flash_attention_backward"]))
    return LocalNamespace(ns)


def _fails(grade_id, ns, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](ns)


# --- tests -----------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


@pytest.mark.parametrize("grade_id", GRADE_IDS)
def test_correct_implementation_passes(grade_id):
    CHECKS[grade_id](namespace())


def test_unguarded_flash1_order_passes():
    """With key blocks outside and every row seeing key 0 first, no running max is ever -inf: correct."""
    ns = namespace(flash_attention_forward=make_forward(guard=False))
    for grade_id in FORWARD_IDS[:2] + FUNCTION_IDS[:1]:
        CHECKS[grade_id](ns)


# (wrong forward, the cell it fails, the message, the cells it passes)
VALUES, EDGE, MEMORY = FORWARD_IDS


# The other wrong forwards (no normalisation, masked rows, causal off by one, ragged tails, dtype, N × N on long
# sequences, a whole row of tiles) are clauses of CONTRACT below, which runs every cell of the exercise that does
# not wait on a lost one and checks the same messages.
@pytest.mark.parametrize("wrong, grade_id, message, passes", [
    (make_forward(rescale=False), VALUES, "multiply what was accumulated", (EDGE,)),
], ids=["no_rescale"])
def test_forward_fails_its_property_only(wrong, grade_id, message, passes):
    ns = namespace(flash_attention_forward=wrong)
    _fails(grade_id, ns, message)
    for other in passes:
        CHECKS[other](ns)


@pytest.mark.parametrize("wrong, message", [
    (make_forward(materialise="always"), "N × N"),
    (forward_sdpa, "scaled_dot_product_attention"),
], ids=["materialise", "sdpa"])
def test_forward_shortcuts_fail_every_cell(wrong, message):
    for grade_id in FORWARD_IDS:
        _fails(grade_id, namespace(flash_attention_forward=wrong), message)


B_VALUES, B_EDGE, B_MEMORY = BACKWARD_IDS


# Each wrong backward (τ, D, the causal mask, ragged tails, dtype, N × N, a whole column of tiles) is a clause of
# CONTRACT below, which fails its cell with the same message and runs every other cell that does not wait on it.


def test_backward_materialising_fails_every_cell():
    for grade_id in BACKWARD_IDS:
        _fails(grade_id, namespace(flash_attention_backward=make_backward(materialise="always")), "N × N")


F_VALUES, F_MEMORY = FUNCTION_IDS


# Saving P, stashing it on ctx and a wrong backward of its own are clauses of CONTRACT below (same messages).
@pytest.mark.parametrize("wrong, grade_id, message, passes", [
    (FunctionIgnoringCausal, F_VALUES, "same causal flag", (F_MEMORY,)),
], ids=["ignores_causal"])
def test_function_fails_its_property_only(wrong, grade_id, message, passes):
    ns = namespace(FlashAttention=wrong)
    _fails(grade_id, ns, message)
    for other in passes:
        CHECKS[other](ns)


def test_function_recomputing_lse_passes():
    """Saving q, k, v and o and recomputing lse in backward keeps less, not more: memory is read from outside the
    process and the values are right, so both cells pass (what is saved, counted inside, only explains)."""
    ns = namespace(FlashAttention=make_function(make_forward(), make_backward(), save="no_lse"))
    for grade_id in FUNCTION_IDS:
        CHECKS[grade_id](ns)


def test_function_backward_error_fails_with_the_students_own_error():
    """Backward returning three gradients for six inputs raises in autograd: the values cell fails with the
    student's own error, and so does the memory cell, which back-propagates through the graph it measured
    (at autograde it waits on the values cell anyway)."""
    ns = namespace(FlashAttention=make_function(make_forward(), make_backward(), all_inputs=False))
    for grade_id in FUNCTION_IDS:
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            CHECKS[grade_id](ns)


def test_function_names_the_students_own_wrong_parts():
    """When FlashAttention only passes on what the student's own forward or backward gets wrong, the
    message sends them there rather than to the wiring."""
    bwd = make_backward(tau_in_grads=False)
    _fails(F_VALUES, namespace(flash_attention_backward=bwd), "your flash_attention_backward returns this gradient")
    fwd = forward_unnormalised
    _fails(F_VALUES, namespace(flash_attention_forward=fwd), "your flash_attention_forward returns this output")


T_VALUES, T_MEMORY, T_BOUNDS = TRITON_IDS


# PyTorch on long sequences and the unmasked loads of k, v and q are clauses of CONTRACT below (same messages,
# every other Triton cell run).
@pytest.mark.parametrize("variant, grade_id, message, passes", [
    ("no_rescale", T_VALUES, "multiply what was accumulated", (T_BOUNDS,)),
    ("causal_off_by_one", T_VALUES, r"keys 0\.\.i.*row i see key i \+ 1", (T_BOUNDS,)),
    ("unmasked_store", T_BOUNDS, "tl.store of o_ptr addressed .* past the end", (T_MEMORY,)),  # values: below
])
def test_triton_fails_its_property_only(variant, grade_id, message, passes):
    ns = namespace(flash_attention_triton=make_triton(variant))
    _fails(grade_id, ns, message)
    for other in passes:
        CHECKS[other](ns)


def test_triton_unmasked_store_also_overwrites_the_next_head():
    """Rows past N of one head are the first rows of the next: an unmasked store is wrong on any device."""
    _fails(T_VALUES, namespace(flash_attention_triton=make_triton("unmasked_store")), "o for")


def test_triton_in_torch_fails_every_cell():
    for grade_id in TRITON_IDS:
        _fails(grade_id, namespace(flash_attention_triton=make_triton("torch")),
               "must be computed by your Triton kernel")


def test_triton_cells_fail_when_the_interpreter_was_changed(monkeypatch):
    """A kernel run after Triton's interpreter was changed (its memory accesses rerouted) fails every
    Triton cell: the probe compares the interpreter with what it saw before any student code ran."""
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_masked_load
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_load",
                        lambda self, *args: original(self, *args))
    for grade_id in (T_VALUES, T_BOUNDS):
        _fails(grade_id, namespace(flash_attention_triton=make_triton("unmasked_k")), "changed Triton's interpreter")


def test_triton_bounds_probe_leaves_the_interpreter_as_it_was():
    from grader import probes

    q, k, v = (torch.randn(1, 1, 70, 16) for _ in range(3))
    run = probes.ch10_triton_run(make_triton("unmasked_v"), q, k, v, False)
    assert run["bounds"]["launches"] == 1 and run["bounds"]["outside"] > 0 and run["bounds"]["tampered"] is None
    assert probes._ch10_changed(probes._CH10_INTERPRETER) is None
    assert torch.isfinite(run["result"]).all()  # lanes past the end of v read 0, not what lies there


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, {"FlashAttention": "test_FlashAttention_memory",
                     "flash_attention_triton": "test_flash_attention_triton_bounds"})


# --- calls that grade a rule compare values too -----------------------------------------------------
def test_forward_computing_only_below_the_gate_fails_every_cell():
    """Naive attention below N = 128, zeros from there on: every cell's gate compares the values of its call
    at N = 128 (causal too in the edge-case cell), and the memory cell those of the call it measures."""
    for grade_id in FORWARD_IDS:
        _fails(grade_id, namespace(flash_attention_forward=forward_naive_below_gate),
               r"o for \(B, H, N, d\) = \(1, 2, 128, 16\), causal=False.* differs")


def test_backward_computing_only_below_the_gate_fails_every_cell():
    for grade_id in BACKWARD_IDS:
        _fails(grade_id, namespace(flash_attention_backward=backward_naive_below_gate),
               r"for \(B, H, N, d\) = \(1, 2, 128, 16\), causal=False.* differs")


# An answer that computes nothing (or part of it elsewhere) on the long sequences the memory cells measure fails
# there, each measured call's values being compared on rows drawn at grading time: the clauses "That call's o and
# lse are compared", "That call's dq ... are compared", "backward through that very o" and "that call's o is
# compared with float64 attention" of CONTRACT below.


@pytest.mark.parametrize("wrong, message", [
    (triton_rowwise_torch, "PyTorch ran .*mul.*must be computed by your Triton kernel"),
    (triton_copier, "PyTorch ran .*must be computed by your Triton kernel"),
], ids=["rowwise_torch", "copier"])
def test_triton_torch_around_the_kernel_fails_every_cell(wrong, message):
    """Only allocation, views and copies may run in PyTorch around the launch; the memory cell, whose call is
    not traced, refuses them by what the kernel's stores wrote."""
    for grade_id in TRITON_IDS:
        _fails(grade_id, namespace(flash_attention_triton=wrong),
               message if grade_id != T_MEMORY else "must be computed by your Triton kernel")


def test_triton_copier_loads_what_is_not_an_input():
    """Without the operator trace's verdict, the copier's loads read a tensor that is not q, k or v."""
    from grader import probes

    q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
    run = probes.ch10_triton_run(triton_copier, q, k, v, False)
    assert run["bounds"]["foreign_loads"] == ["src_ptr"] and run["bounds"]["unwritten"] == 0
    run = probes.ch10_triton_run(triton_rowwise_torch, q, k, v, False)
    assert run["bounds"]["unwritten"] == q.numel() and not run["bounds"]["result_stored"]


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
FWD, BWD, FN, TRI = "flash_attention_forward", "flash_attention_backward", "FlashAttention", "flash_attention_triton"
GATE = "there no torch operator may create a tensor of N² elements or more"


def _fwd(says, cells, wrong, message, label=""):
    return Clause(FWD, says, cells, {FWD: wrong}, message, label=label)


def _bwd(says, cells, wrong, message, label=""):
    return Clause(BWD, says, cells, {BWD: wrong}, message, label=label)


def _fn(says, cells, wrong, message, label=""):
    return Clause(FN, says, cells, {FN: wrong}, message, label=label)


def _tri(says, cells, wrong, message, label=""):
    return Clause(TRI, says, cells, {TRI: wrong if callable(wrong) else make_triton(wrong)}, message, label=label)


CONTRACT = [
    _fwd("so that a missing rescale shows", (VALUES,), make_forward(rescale=False), "multiply what was accumulated"),
    _fwd("softmax(q kᵀ / sqrt(d)) v", (VALUES,), forward_unnormalised, "plain softmax attention"),
    _fwd("A tile can mask a whole row", (EDGE,), make_forward(local_max=True), "NaN", label="masked-row-local-max"),
    _fwd("A tile can mask a whole row", (EDGE,), forward_reversed, "NaN", label="masked-row-reversed"),
    _fwd("causal: if True, query i attends to keys 0..i only.", (EDGE,), make_forward(causal_shift=1),
         r"keys 0\.\.i.*row i see key i \+ 1", label="causal-plus-one"),
    _fwd("causal: if True, query i attends to keys 0..i only.", (EDGE,), make_forward(causal_shift=-1),
         r"NaN.*keys 0\.\.i", label="causal-minus-one"),
    _fwd("the last blocks are shorter", (EDGE,), make_forward(pad_mask=False), "nothing past N.*padding keys"),
    _fwd("float32 (float64 for float64 inputs)", (EDGE,), make_forward(keep_dtype=False),
         "dtype torch.float32, expected torch.float64"),
    _fwd("Scoring a query block against all keys at once, or anything N × N, takes more", (MEMORY,),
         make_forward(materialise="long"), "N × N", label="n-by-n-when-long"),
    _fwd("Scoring a query block against all keys at once, or anything N × N, takes more", (MEMORY,),
         forward_rows_only, "a whole row or column of tiles", label="row-of-tiles"),
    _fwd(GATE, (VALUES,), make_forward(materialise="always"), "N × N", label="n-by-n-always"),
    _fwd("Fused attention, torch's attention layers, NumPy and the course's kernels are refused", (VALUES,),
         forward_sdpa, "scaled_dot_product_attention"),
    _fwd("Their o and lse are compared too: the non-causal call's in every cell", (VALUES,),
         forward_naive_below_gate, r"o for \(B, H, N, d\) = \(1, 2, 128, 16\), causal=False.* differs"),
    _fwd("That call's o and lse are compared on rows drawn at grading time", (MEMORY,), forward_zeros_when_long,
         r"o \(its rows .* drawn at grading time\)"),
    _bwd("the $\\tau$ comes from $S = \\tau QK^\\top$", (B_VALUES,), make_backward(tau_in_grads=False),
         "the factor τ is missing"),
    _bwd("computed once, before the loop, from the *normalised* output", (B_VALUES,),
         make_backward(delta="unnormalised"), "normalised output"),
    _bwd("D = \\mathrm{rowsum}(dO \\circ O)", (B_VALUES,), make_backward(delta="zero"), "D = rowsum.*is missing"),
    _bwd("the masked entries of $P$ are exactly 0", (B_EDGE,), make_backward(causal_shift=1),
         r"P_ij = 0 for keys j > i.*key i \+ 1"),
    _bwd("ragged last blocks, one block larger than N", (B_EDGE,), make_backward(floor_blocks=True), "differs"),
    _bwd("each (B, H, N, d) in the dtype of its input", (B_EDGE,), make_backward(keep_dtype=False),
         "dtype torch.float32, expected torch.float64"),
    _bwd("A key block against all N queries at once, a query block against all keys, or anything N × N takes more",
         (B_MEMORY,), make_backward(materialise="long"), "N × N", label="n-by-n-when-long"),
    _bwd("A key block against all N queries at once, a query block against all keys, or anything N × N takes more",
         (B_MEMORY,), backward_columns_only, "a whole row or column of tiles", label="column-of-tiles"),
    _bwd(GATE, (B_VALUES,), make_backward(materialise="always"), "N × N", label="n-by-n-always"),
    _bwd("Their gradients are compared too: the non-causal call's in every cell", (B_VALUES,),
         backward_naive_below_gate, r"for \(B, H, N, d\) = \(1, 2, 128, 16\), causal=False.* differs"),
    _bwd("That call's dq (at query rows), dk and dv (at key rows) are compared on rows drawn", (B_MEMORY,),
         backward_zeros_when_long, r"dq \(its rows .* drawn at grading time\)"),
    _fn("Saves for backward only q, k, v, o and the log-sum-exp", (F_MEMORY,),
        make_function(make_forward(), make_backward(), save="probabilities"),
        "read from outside your process.*Inside your process.*bytes were saved for backward"),
    _fn("may hold no more than o, lse and a quarter of one N × N float32 tensor", (F_MEMORY,),
        make_function(make_forward(), make_backward(), save="stash"), "read from outside your process"),
    _fn("the gradients reaching q, k and v are compared with float64 attention and autograd", (F_VALUES,),
        make_function(make_forward(), make_backward(tau_in_grads=False)), "the gradient of q.*same causal flag"),
    _fn("the block sizes and the causal flag go on ctx as plain attributes", (F_VALUES,), FunctionIgnoringCausal,
        "same causal flag"),
    Clause(FN, "its backward returns one gradient per input of forward", (F_VALUES,),
           {FN: make_function(make_forward(), make_backward(), all_inputs=False)}, "incorrect number of gradients",
           raises="RuntimeError"),  # the student's own error, from autograd
    _fn("backward through that very o", (F_MEMORY,), FunctionSavingNothingWhenLong, r"the gradient of q \(its rows"),
    _tri("including inputs whose row maxima rise from key block to key block", (T_VALUES,), "no_rescale",
         "multiply what was accumulated"),
    _tri("if CAUSAL, columns after the row", (T_VALUES,), "causal_off_by_one", r"keys 0\.\.i.*row i see key i \+ 1"),
    _tri("The call is not traced: its launch, loads and stores are checked", (T_MEMORY,), "torch_long",
         "must be computed by your Triton kernel"),
    _tri("every load and store of the last, ragged block is masked", (T_BOUNDS,), "unmasked_k",
         "tl.load of k_ptr addressed .* past the end", label="unmasked-k"),
    _tri("every load and store of the last, ragged block is masked", (T_BOUNDS,), "unmasked_v",
         "tl.load of v_ptr addressed .* past the end", label="unmasked-v"),
    _tri("every load and store of the last, ragged block is masked", (T_BOUNDS,), "unmasked_q",
         "tl.load of q_ptr addressed .* past the end", label="unmasked-q"),
    _tri("whose stores write every element of the o returned, and nothing else", (T_VALUES,), "unmasked_store",
         "o for"),
    _tri("around the launch PyTorch may only allocate, view or copy tensors", (T_VALUES,), "torch",
         "must be computed by your Triton kernel", label="torch-only"),
    _tri("around the launch PyTorch may only allocate, view or copy tensors", (T_VALUES,), triton_rowwise_torch,
         "PyTorch ran .*mul.*must be computed by your Triton kernel", label="rowwise-torch"),
    _tri("around the launch PyTorch may only allocate, view or copy tensors", (T_VALUES,), triton_copier,
         "PyTorch ran .*must be computed by your Triton kernel", label="copier"),
    _tri("that call's o is compared with float64 attention on rows drawn at grading time", (T_MEMORY,),
         triton_first_block_when_long, "not one your kernel stored into"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
