"""Chapter 10's hidden tests: correct implementations pass, plausible wrong ones fail, in-kernel and sandboxed.

The correct family here differs from the solution on purpose: FlashAttention-1 loop order (key blocks
outside, a running state per query row updated in place), the block-local max merged into the running
one, padding to whole blocks with explicit masks, and a Triton kernel without block skipping.
"""
import math

import pytest
import torch

import kernels  # noqa: F401 - before triton
import triton
import triton.language as tl
from grader.api import LocalNamespace, checks_for
from sandbox_checks import sandbox_tests
from wrong_submissions_ch10_flash_attention import WRONG

CHAPTER = "ch10_flash_attention"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = ("test_flash_attention_forward", "test_flash_attention_backward", "test_FlashAttention",
             "test_flash_attention_triton")
NEG = float("-inf")


# --- forward: FlashAttention-1 order, a family of pitfalls behind flags ----------------------------
def make_forward(rescale=True, guard=True, causal_shift=0, materialise=False, pad_mask=True, local_max=False):
    def forward(q, k, v, causal=False, block_q=32, block_k=32):
        B, H, N, d = q.shape
        if materialise:  # builds the whole N × N score matrix, then reads it tile by tile
            full = torch.einsum("bhid,bhjd->bhij", q, k)
        tau = d ** -0.5
        pad = (-N) % block_k if not pad_mask else 0
        kp = torch.nn.functional.pad(k, (0, 0, 0, pad))
        vp = torch.nn.functional.pad(v, (0, 0, 0, pad))
        m = torch.full((B, H, N), NEG)
        l = torch.zeros(B, H, N)
        acc = torch.zeros(B, H, N, d)
        for j in range(0, kp.shape[2], block_k):
            kj, vj = kp[:, :, j:j + block_k], vp[:, :, j:j + block_k]
            cols = torch.arange(j, j + kj.shape[2])
            for i in range(0, N, block_q):
                rows = torch.arange(i, min(i + block_q, N))
                s = (full[:, :, i:i + block_q, j:j + block_k] if materialise else q[:, :, i:i + block_q] @ kj.mT) * tau
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
        return acc / l[..., None], m + l.log()

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
def make_backward(tau_in_grads=True, delta="o", causal_shift=0, materialise=False):
    def backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
        B, H, N, d = q.shape
        tau = 1 / math.sqrt(d)
        if delta == "o":
            D = (do * o).sum(-1)
        elif delta == "unnormalised":  # rowsum(dO ∘ Õ) with Õ = Σ_j exp(S_ij) V_j
            D = (do * o * torch.exp(lse)[..., None]).sum(-1)
        else:
            D = torch.zeros(B, H, N)
        if materialise:
            p_full = torch.exp(q @ k.mT * tau - lse[..., None])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        g = tau if tau_in_grads else 1.0
        for i in range(0, N, block_q):
            rows = torch.arange(i, min(i + block_q, N))
            for j in range(0, N, block_k):
                cols = torch.arange(j, min(j + block_k, N))
                qi, kj, vj, doi = q[:, :, i:i + block_q], k[:, :, j:j + block_k], v[:, :, j:j + block_k], do[:, :, i:i + block_q]
                if materialise:
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
def make_function(fwd, bwd, save="exact"):
    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
            o, lse = fwd(q, k, v, causal, block_q, block_k)
            if save == "exact":
                ctx.save_for_backward(q, k, v, o, lse)
            elif save == "probabilities":  # also keeps P, the N × N matrix
                p = torch.exp(q @ k.mT / math.sqrt(q.shape[-1]) - lse[..., None])
                ctx.save_for_backward(q, k, v, o, lse, p)
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
            return (*bwd(q, k, v, o, lse, do, causal, bq, bk), None, None, None)

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
        if variant == "torch":
            s = q @ k.mT / math.sqrt(q.shape[-1])
            if causal:
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), NEG)
            return torch.softmax(s, -1) @ v

        @triton.jit
        def kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, RESCALE: tl.constexpr, SHIFT: tl.constexpr):
            i = tl.program_id(0)
            off = tl.program_id(1) * N * HEAD_DIM
            r = i * BLOCK_M + tl.arange(0, BLOCK_M)
            c = tl.arange(0, HEAD_DIM)
            qb = tl.load(q_ptr + off + r[:, None] * HEAD_DIM + c[None, :], mask=r[:, None] < N, other=0.0)
            mx = tl.zeros([BLOCK_M], tl.float32) - float("inf")
            den = tl.zeros([BLOCK_M], tl.float32)
            num = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            for j in range(0, N, BLOCK_N):
                cc = j + tl.arange(0, BLOCK_N)
                kb = tl.load(k_ptr + off + cc[:, None] * HEAD_DIM + c[None, :], mask=cc[:, None] < N, other=0.0)
                vb = tl.load(v_ptr + off + cc[:, None] * HEAD_DIM + c[None, :], mask=cc[:, None] < N, other=0.0)
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
            tl.store(o_ptr + off + r[:, None] * HEAD_DIM + c[None, :], num / den[:, None], mask=r[:, None] < N)

        q, k, v = (t.contiguous() for t in (q, k, v))
        B, H, N, d = q.shape
        o = torch.empty_like(q)
        kernel[(triton.cdiv(N, 32), B * H)](q, k, v, o, N, d ** -0.5, HEAD_DIM=d, BLOCK_M=32, BLOCK_N=32,
                                            CAUSAL=causal, RESCALE=variant != "no_rescale",
                                            SHIFT=1 if variant == "causal_off_by_one" else 0)
        return o

    return flash_attention_triton


def namespace(**overrides) -> LocalNamespace:
    ns = {"flash_attention_forward": make_forward(), "flash_attention_backward": make_backward(),
          "flash_attention_triton": make_triton()}
    ns.update(overrides)
    ns.setdefault("FlashAttention", make_function(ns["flash_attention_forward"], ns["flash_attention_backward"]))
    return LocalNamespace(ns)


# --- tests -----------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


@pytest.mark.parametrize("grade_id", GRADE_IDS)
def test_correct_implementation_passes(grade_id):
    CHECKS[grade_id](namespace())


def test_unguarded_flash1_order_passes():
    """With key blocks outside and every row seeing key 0 first, no running max is ever -inf: correct."""
    ns = namespace(flash_attention_forward=make_forward(guard=False))
    CHECKS["test_flash_attention_forward"](ns)
    CHECKS["test_FlashAttention"](ns)


@pytest.mark.parametrize("wrong, message", [
    (make_forward(rescale=False), "multiply what was accumulated"),
    (make_forward(local_max=True), "NaN"),
    (forward_reversed, "NaN"),
    (make_forward(causal_shift=1), "keys 0..i"),
    (make_forward(causal_shift=-1), "NaN|keys 0..i"),
    (make_forward(materialise=True), "N × N"),
    (make_forward(pad_mask=False), "nothing past N"),
    (forward_sdpa, "scaled_dot_product_attention"),
    (forward_unnormalised, "plain softmax attention"),
])
def test_forward_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_flash_attention_forward"](namespace(flash_attention_forward=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_backward(tau_in_grads=False), "the factor τ is missing"),
    (make_backward(delta="unnormalised"), "normalised output"),
    (make_backward(delta="zero"), "D = rowsum"),
    (make_backward(causal_shift=1), "Pᵀ dO"),
    (make_backward(materialise=True), "N × N"),
])
def test_backward_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_flash_attention_backward"](namespace(flash_attention_backward=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_function(make_forward(), make_backward(), save="probabilities"), "exactly q, k, v, o and lse"),
    (make_function(make_forward(), make_backward(), save="no_lse"), "exactly q, k, v, o and lse"),
    (make_function(make_forward(), make_backward(tau_in_grads=False)), "gradient of q"),
    (FunctionIgnoringCausal, "same causal flag"),
])
def test_function_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_FlashAttention"](namespace(FlashAttention=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_triton("no_rescale"), "multiply what was accumulated"),
    (make_triton("causal_off_by_one"), "keys 0..i"),
    (make_triton("torch"), "must be computed by your Triton kernel"),
])
def test_triton_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_flash_attention_triton"](namespace(flash_attention_triton=wrong))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)
