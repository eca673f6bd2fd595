"""Hidden tests of chapter 10 (FlashAttention).

References are naive float64 attention and plain autograd, computed here in the judge. Inputs
have awkward lengths (N = 37, 70, 77, 100 against blocks of 8..64) so that tails are ragged, and
one family of inputs ("rising") makes every row's max grow from key block to key block, so a
missing rescale of the running output cannot hide. What cannot be recomputed from outputs is
measured in the student's process by trusted probes: the largest tensor any operator creates
(``probes.ch10_trace``; an N × N tensor means the matrix was materialised) and what autograd saves
(``probes.ch10_autograd_run``, exact bytes and shapes).
"""
from __future__ import annotations

import math

import torch

from coursekit.checks import check_close, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, fresh_tensor, mib
from grader.source_policy import Shortcut, SourcePolicy

# Tiles by hand: no fused attention (any spelling), no NumPy (invisible to the operator trace), not the
# course's own kernels; the Triton exercise may use triton and triton.language.
SOURCE_POLICY = SourcePolicy(modules=("triton",), refused=("numpy",), shortcuts=(
    Shortcut(paths=("torch.nn.functional.scaled_dot_product_attention", "torch.nn.attention"),
             pattern=r"scaled_dot_product",
             instead="write the tiled loop with the online softmax yourself"),
    # Library layers that run fused attention inside them.
    Shortcut(paths=("torch.nn.functional.multi_head_attention_forward", "torch.nn.MultiheadAttention",
                    "torch.nn.Transformer", "torch.nn.TransformerEncoderLayer", "torch.nn.TransformerDecoderLayer",
                    "torch.nn.TransformerEncoder", "torch.nn.TransformerDecoder", "torch.backends.cuda"),
             pattern=r"multi_head_attention|MultiheadAttention|Transformer|sdp_kernel|_attention_forward",
             instead="write the tiled loop with the online softmax yourself; attention layers of torch.nn "
                     "compute attention for you"),
    Shortcut(pattern=r"^numpy$", instead="compute with torch (or Triton) operations"),
    Shortcut(paths=("kernels.ch10_flash_attention",),
             instead="write the kernels yourself; kernels.ch10_flash_attention is the course's own answer"),
))

TOL = dict(atol=2e-5, rtol=1e-4)  # float32 tiles against float64: only the summation order differs
GRAD_TOL = dict(atol=1e-4, rtol=1e-3)
RESCALE_HINT = ("with one key block it is right, with several it is not: when a new key block raises a row's "
                "running max from m to m', multiply what was accumulated (the running sum l and the running "
                "output) by exp(m - m') before adding the new block's terms")
CAUSAL_HINT = ("with causal=True query i attends to keys 0..i, its own position included: mask the scores of "
               "columns j > i (and only those) with -inf before the max and the exponential")
NAN_HINT = ("a row whose scores in a tile are all masked has max -inf, and exp(-inf - (-inf)) is NaN: "
            "subtract 0 instead of the max for such rows (or keep the running max finite) so that their "
            "weights are exactly 0")
TAIL_HINT = ("N is not a multiple of the block sizes: the last query and key blocks are shorter; "
             "slices stop at N by themselves, and nothing past N may enter a sum")
LSE_HINT = "lse is the log-sum-exp of each row's (masked, scaled) scores: m + log(l) after the last key block"
NN_HINT = ("the tiled algorithm never creates a tensor of N × N elements (not even a boolean mask): "
           "compute scores, masks and probabilities one (block_q × block_k) tile at a time")
SDPA_HINT = "write the tiled loop yourself; torch's scaled_dot_product_attention does not count"
SCALE_HINT = ("S = τ q kᵀ with τ = 1/sqrt(d), so dq = τ dS k and dk = τ dSᵀ q: the factor τ is missing "
              "(or applied twice)")
DELTA_HINT = ("dS = P ∘ (dP − D) with D = rowsum(dO ∘ O), O being the normalised output o you are given "
              "(not the running, unnormalised one)")
DV_HINT = ("dv = Pᵀ dO, with P = exp(τ q kᵀ − lse) recomputed for each tile from the saved log-sum-exp "
           "(masked entries exactly 0)")
SAVE_HINT = ("FlashAttention.forward saves exactly q, k, v, o and lse with ctx.save_for_backward, nothing "
             "else (no scores, no probabilities, no copies); the block sizes and causal go on ctx as attributes")


# --- inputs and references -------------------------------------------------------------------------
def _qkv(B, H, N, d, seed, rising=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g) for _ in range(3))
    if rising:  # positive queries, keys drifting upwards: each row's max grows along the keys
        q = q.abs()
        k = 0.5 * k + 4.0 * torch.arange(N, dtype=torch.float32)[:, None] / N
    return q, k, v


def _reference(q, k, v, causal):
    q, k, v = (t.double() for t in (q, k, v))
    n, d = q.shape[-2:]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _reference_grads(q, k, v, do, causal):
    ins = [t.double().requires_grad_() for t in (q, k, v)]
    o, _ = _reference(*ins, causal)
    return torch.autograd.grad(o, ins, do.double())


def _finite(t, name, where):
    if isinstance(t, torch.Tensor) and not torch.isfinite(t).all():
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise AssertionError(f"{where}: {name} contains NaN or inf (first at index {tuple(bad)}). {NAN_HINT}")


def _close(got, ref, name, where, hint, tol=TOL):
    _finite(got, name, where)
    check_close(got, ref.float(), f"{name} {where}", hint, **tol)


def _trace(nb, fn_name, *args):
    return fetch(nb.apply(probes.ch10_trace, nb[fn_name], *args))


def _pair(result, where, what):
    if not isinstance(result, (tuple, list)) or len(result) != len(what):
        raise AssertionError(f"{where}: expected a tuple ({', '.join(what)}), got {type(result).__name__}")
    return result


def _check_no_nxn(traced, n, where):
    if any("scaled_dot_product" in op for op in traced["ops"]):
        raise AssertionError(f"{where}: scaled_dot_product_attention was called. {SDPA_HINT}")
    if traced["max_elements"] >= n * n:
        raise AssertionError(f"{where}: a tensor of shape {tuple(traced['max_shape'])} "
                             f"({traced['max_elements']:,} elements ≥ N² = {n * n:,}) was created. {NN_HINT}")


# --- forward -----------------------------------------------------------------------------------------
def _forward_case(nb, shape, causal, bq, bk, seed, rising=False, hint=""):
    q, k, v = _qkv(*shape, seed=seed, rising=rising)
    where = f"for (B, H, N, d) = {shape}, causal={causal}, block_q={bq}, block_k={bk}"
    traced = _trace(nb, "flash_attention_forward", q, k, v, causal, bq, bk)
    o, lse = _pair(traced["result"], where, ("o", "lse"))
    o_ref, lse_ref = _reference(q, k, v, causal)
    _close(o, o_ref, "o", where, hint)
    _close(lse, lse_ref, "lse", where, LSE_HINT)
    return traced


@hidden_test("test_flash_attention_forward")
def check_flash_attention_forward(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    # One block covers everything: plain softmax attention, no online update involved.
    _forward_case(nb, (2, 3, 37, 16), False, 64, 64, seed=1, hint="with a single block this is plain softmax "
                  "attention, softmax(q kᵀ / sqrt(d)) v, over the N keys: the block is larger than N, and "
                  "nothing past N may enter a sum")
    # Several key blocks, every row's max rising along them.
    _forward_case(nb, (1, 2, 37, 16), False, 64, 8, seed=2, rising=True, hint=RESCALE_HINT)
    _forward_case(nb, (2, 2, 100, 16), False, 32, 32, seed=3, rising=True, hint=RESCALE_HINT)
    # Causal: diagonal inside tiles, whole rows masked in a tile (block_q > block_k), the reverse.
    _forward_case(nb, (1, 3, 100, 16), True, 32, 32, seed=5, hint=CAUSAL_HINT)
    _forward_case(nb, (2, 2, 70, 16), True, 32, 16, seed=6, hint=CAUSAL_HINT)
    _forward_case(nb, (1, 2, 70, 16), True, 16, 32, seed=7, rising=True, hint=CAUSAL_HINT)
    _forward_case(nb, (1, 1, 37, 16), True, 64, 8, seed=8, hint=CAUSAL_HINT)
    # Ragged tails with blocks of different sizes, and never an N × N tensor (N = 100 > d, B·H·N·d < N²).
    for causal in (False, True):
        traced = _forward_case(nb, (1, 2, 100, 16), causal, 32, 16, seed=9, hint=CAUSAL_HINT if causal else TAIL_HINT)
        _check_no_nxn(traced, 100, f"in flash_attention_forward (N = 100, causal={causal})")
    _check_peak(nb, meter, "flash_attention_forward", 4096, lambda q, k, v: (q, k, v, False, 64, 64))


def _check_peak(nb, meter: Meter, fn_name: str, n: int, args, d: int = 64) -> dict:
    """One call on N = n, traced, with the memory the process reaches while it runs read from outside
    it: no N × N tensor exists at any moment, whatever the code does to hide it from the op trace."""
    fn = nb[fn_name]
    q, k, v = meter.judge(lambda: [fresh_tensor(nb, (1, 1, n, d), requires_grad=False) for _ in range(3)])
    # Warm up on every code path (several blocks, traced): the first call loads code pages.
    nb.apply(probes.ch10_trace, fn, *args(*(fresh_tensor(nb, (1, 1, 256, d), requires_grad=False) for _ in range(3))))
    held, traced = meter.held_by(lambda: nb.apply(probes.ch10_trace, fn, *args(q, k, v)))
    where = f"{fn_name} on (B, H, N, d) = (1, 1, {n}, {d})"
    _check_no_nxn(traced, n, f"in {where}")
    square = n * n * 4
    if held.peak >= square // 4:
        raise AssertionError(
            f"{where}: while it ran, your process grew by {mib(held.peak)} (read from outside your process); one "
            f"N × N float32 tensor is {mib(square)}, the inputs together {mib(3 * n * d * 4)}. {NN_HINT}")
    return traced


# --- backward ----------------------------------------------------------------------------------------
def _backward_case(nb, shape, causal, bq, bk, seed):
    q, k, v = _qkv(*shape, seed=seed)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100))
    o, lse = (t.float() for t in _reference(q, k, v, causal))
    where = f"for (B, H, N, d) = {shape}, causal={causal}, block_q={bq}, block_k={bk}"
    traced = _trace(nb, "flash_attention_backward", q, k, v, o, lse, do, causal, bq, bk)
    grads = _pair(traced["result"], where, ("dq", "dk", "dv"))
    refs = _reference_grads(q, k, v, do, causal)
    for name, g in zip(("dq", "dk", "dv"), grads):
        _finite(g, name, where)
    _close(grads[2], refs[2], "dv", where, DV_HINT, GRAD_TOL)
    d = shape[-1]
    for name, g, r in zip(("dq", "dk"), grads[:2], refs[:2]):
        if isinstance(g, torch.Tensor) and g.shape == r.shape:
            for factor in (math.sqrt(d), 1 / math.sqrt(d)):  # τ missing, or applied twice
                if same_close(g.double(), r * factor, atol=1e-4, rtol=1e-3):
                    raise AssertionError(f"{name} {where} is the reference times {factor:.3g}. {SCALE_HINT}")
        _close(g, r, name, where, f"{DELTA_HINT}; {CAUSAL_HINT}" if causal else DELTA_HINT, GRAD_TOL)
    return traced


@hidden_test("test_flash_attention_backward")
def check_flash_attention_backward(nb):
    _backward_case(nb, (1, 2, 37, 16), False, 64, 64, seed=11)  # one tile
    _backward_case(nb, (2, 2, 100, 16), False, 32, 32, seed=12)
    _backward_case(nb, (1, 3, 77, 16), True, 32, 16, seed=14)
    _backward_case(nb, (2, 1, 70, 16), True, 16, 32, seed=15)
    traced = _backward_case(nb, (1, 2, 100, 16), True, 32, 32, seed=16)
    _check_no_nxn(traced, 100, "in flash_attention_backward (N = 100, causal=True)")
    traced = _backward_case(nb, (1, 2, 100, 16), False, 32, 16, seed=17)
    _check_no_nxn(traced, 100, "in flash_attention_backward (N = 100, causal=False)")


# --- the autograd Function -----------------------------------------------------------------------
def _function_case(nb, shape, seed, *extra):
    causal = bool(extra[0]) if extra else False
    q, k, v = _qkv(*shape, seed=seed)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100))
    args = ", ".join(["q", "k", "v", *map(str, extra)])
    where = f"for FlashAttention.apply({args}) with (B, H, N, d) = {shape}"
    run = fetch(nb.apply(probes.ch10_autograd_run, nb.FlashAttention.apply, q, k, v, do, *extra))
    if not run["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph; forward must return o "
                             "computed from its inputs inside a torch.autograd.Function")
    o_ref, _ = _reference(q, k, v, causal)
    _close(run["o"], o_ref, "the output", where, "forward returns o from flash_attention_forward")
    for name, g, r in zip(("q", "k", "v"), run["grads"], _reference_grads(q, k, v, do, causal)):
        if g is None:
            raise AssertionError(f"{where}: no gradient reached {name}: backward returns (dq, dk, dv, None, ...)")
        _close(g, r, f"the gradient of {name}", where, "backward calls flash_attention_backward with what forward "
               "saved and the same causal flag and block sizes", GRAD_TOL)
    B, H, N, d = shape
    expected = 4 * (4 * B * H * N * d + B * H * N)
    shapes = sorted(map(tuple, (s["shape"] for s in run["saved"])))
    want = sorted([(B, H, N, d)] * 4 + [(B, H, N)])
    if run["activation_bytes"] != expected or shapes != want:
        raise AssertionError(f"{where}: {run['activation_bytes']:,} bytes were saved for backward in tensors of "
                             f"shapes {shapes}; expected exactly q, k, v, o and lse: {expected:,} bytes in "
                             f"{want}. {SAVE_HINT}")


@hidden_test("test_FlashAttention")
def check_flash_attention_function(nb):
    _function_case(nb, (2, 2, 70, 16), 21, False, 32, 32)
    _function_case(nb, (1, 3, 77, 16), 22, True, 16, 32)
    _function_case(nb, (1, 2, 45, 32), 23)  # defaults: causal=False, blocks of 32
    _function_case(nb, (1, 2, 45, 16), 24, True)


# --- the Triton kernel ---------------------------------------------------------------------------
TORCH_MATH = ("mm", "bmm", "matmul", "addmm", "baddbmm", "einsum", "exp", "softmax", "_softmax", "logsumexp")


def _check_kernel_computes(traced: dict, where: str) -> None:
    used = sorted(set(traced["ops"]) & set(TORCH_MATH) | {op for op in traced["ops"] if "scaled_dot" in op})
    if used:
        raise AssertionError(f"{where}: PyTorch computed {', '.join(used)}: the attention must be computed "
                             "by your Triton kernel (complete its loop over key blocks)")


@hidden_test("test_flash_attention_triton")
def check_flash_attention_triton(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    cases = [((1, 2, 100, 16), False, 31, True, RESCALE_HINT),  # 4 key blocks of 32, rising maxima
             ((1, 2, 100, 16), True, 32, False, CAUSAL_HINT),
             ((1, 1, 70, 32), True, 33, True, f"{CAUSAL_HINT}; {RESCALE_HINT}")]
    for shape, causal, seed, rising, hint in cases:
        q, k, v = _qkv(*shape, seed=seed, rising=rising)
        where = f"for flash_attention_triton with (B, H, N, d) = {shape}, causal={causal}"
        traced = _trace(nb, "flash_attention_triton", q, k, v, causal)
        _check_kernel_computes(traced, where)
        o = traced["result"]
        o_ref, _ = _reference(q, k, v, causal)
        _close(o, o_ref, "o", where, f"{hint}; masked scores are -inf (columns ≥ N, and after the row if causal)")
    # Causal: half the tiles in the interpreter.
    traced = _check_peak(nb, meter, "flash_attention_triton", 1024, lambda q, k, v: (q, k, v, True), d=16)
    _check_kernel_computes(traced, "for flash_attention_triton with (B, H, N, d) = (1, 1, 1024, 16), causal=True")
