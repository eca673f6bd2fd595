"""Hidden tests of chapter 10 (FlashAttention), one graded cell per property.

References are naive float64 attention and plain autograd, computed here in the judge. Inputs have
awkward lengths (N = 37, 70, 77, 100 against blocks of 8..64) where tails are meant to be ragged,
lengths that are multiples of the blocks where they are not, and one family of inputs ("rising")
makes every row's max grow from key block to key block, so that a missing rescale of the running
output cannot hide. A wrong value is matched against the plausible mistakes, recomputed here (no
rescale, keys past N entering the sums, the causal mask one key off; τ missing in dq and dk, D = 0
or D from the unnormalised output), so that the message names the property that failed.

flash_attention_forward:
- values (test_flash_attention_forward): non-causal, N a multiple of both block sizes: one block
  covering everything, several key blocks with rising maxima, block_q above and below block_k;
- edge cases: ragged last blocks (a block larger than N included), causal (the diagonal inside tiles,
  whole rows of a tile masked when block_q > block_k, the reverse), float64 inputs (o and lse
  float64, float64 tolerances) and float16 inputs (o float16, lse float32), on inputs whose row
  maxima fall along the keys ("falling"), so that a missing rescale, the values cell's, cannot interfere;
- memory: at (B, H, N, d) = (1, 4, N, 16), N drawn at grading time in MEMORY_N, blocks of 128, the
  process's peak, read from outside it, rises by no more than o, lse and 1.5 rows of tiles (a row of
  tiles: one query block against all N keys), which a whole row of tiles at once, let alone N × N,
  exceeds by far; o and lse of that call compared on rows drawn at grading time. The op trace only
  explains a failure, on a call made after the reading.
flash_attention_backward: gradients / edge cases / memory, split the same way (no whole column of tiles;
dq, dk and dv of the memory call compared on rows drawn at grading time, o and lse its inputs).
FlashAttention: values (output attached, values and gradients through apply, every argument form) and
memory (what the graph holds after the forward call on a long sequence, read from outside the process,
then backward through it, o and the gradients compared on rows drawn at grading time; the storages saved
for backward, counted in the student's process, only explain a failed reading).
flash_attention_triton: values, memory (N drawn in TRITON_MEMORY_N, causal) and bounds (every address of
every load and store of the interpreted kernel lies inside the tensor it reads or writes).

Each further cell of an exercise grades its own property, on calls whose values are checked too: a call
that grades a rule (a gate, a memory reading) also compares what it returned with the judge's reference
on the same inputs, so that code which computes only where nothing but values is read (or computes
nothing where a rule is read) is wrong where it does. A wrong value therefore fails a memory cell too;
autograde counts that cell only once the exercise's first cell passes anyway (``grader.api.gates``).
Shortcuts are refused in every cell of their exercise, as they were when each exercise had one cell:
every forward and backward cell first traces two calls at N = 128 (causal and not), where a tensor of
N² elements or fused attention fails it; their values are compared, the non-causal call's in every
cell (on inputs where the rescale cannot show: the values cell grades it), the causal call's in the
edge-case cell, which grades causal masking. Every Triton call runs under ``probes.ch10_triton_run``:
one launch, loads from q, k and v only, every element of o written by the kernel's stores and nothing
else, and (in the traced calls) no torch operator but allocation, views and copies (TRITON_OPS). That
probe also keeps every lane outside a tensor from being read or written, so results never depend on
what lies past a tensor; only the bounds cell fails on such lanes. Op traces and the address checks are
measured in the student's process (claims, kept honest by the source policy and the probe's own check
of Triton's interpreter); the memory bounds are read from outside it, on calls no trace runs in.
"""
from __future__ import annotations

import math

import torch

from coursekit.checks import check_close, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, draw, fresh_tensor, mib, new_seed, seeded
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
DTYPE_TOL = {torch.float32: TOL, torch.float64: dict(atol=1e-10, rtol=1e-8),  # float64 accumulation
             torch.float16: dict(atol=1e-2, rtol=1e-2)}  # o rounded to float16
GRAD_DTYPE_TOL = {torch.float32: GRAD_TOL, torch.float64: dict(atol=1e-10, rtol=1e-8)}
MISTAKE_TOL = dict(atol=1e-4, rtol=1e-3)  # a result "is" a known mistake within this
GATE_N = 128  # the shortcut gate of every forward and backward cell: B·H·N·d < N², no ragged block

ONLINE_HINT = ("the online softmax: for each key block, m' = max(m, rowmax S), P = exp(S − m'), "
               "l' = exp(m − m') l + rowsum P, Õ' = exp(m − m') Õ + P V; at the end o = Õ / l")
SINGLE_BLOCK_HINT = ("with a single block this is plain softmax attention, softmax(q kᵀ / sqrt(d)) v, over the N "
                     "keys: o = Õ / l (divided by the running sum), scores scaled by 1/sqrt(d)")
RESCALE_HINT = ("with one key block it is right, with several it is not: when a new key block raises a row's "
                "running max from m to m', multiply what was accumulated (the running sum l and the running "
                "output) by exp(m - m') before adding the new block's terms")
CAUSAL_HINT = ("with causal=True query i attends to keys 0..i, its own position included: mask the scores of "
               "columns j > i (and only those) with -inf before the max and the exponential")
NAN_HINT = ("a row whose scores in a tile are all masked has max -inf, and exp(-inf - (-inf)) is NaN: "
            "subtract 0 instead of the max for such rows (or keep the running max finite) so that their "
            "weights are exactly 0; with causal=True row i always sees keys 0..i, itself included")
OVERFLOW_HINT = ("exponentiate the scores minus the running max (every exponent ≤ 0, nothing overflows) and "
                 "divide by the running sum over every key of the row, which is never 0")
TAIL_HINT = ("N is not a multiple of the block sizes: the last query and key blocks are shorter; "
             "slices stop at N by themselves, and nothing past N may enter a sum")
LSE_HINT = "lse is the log-sum-exp of each row's (masked, scaled) scores: m + log(l) after the last key block"
DTYPE_HINT = ("o has the dtype of q; accumulate in torch.promote_types(q.dtype, torch.float32) (float32, or "
              "float64 for float64 inputs) and return lse in that dtype")
GRAD_DTYPE_HINT = ("each gradient has the dtype of its input; accumulate in torch.promote_types(q.dtype, "
                   "torch.float32) (float64 for float64 inputs), then convert")
NN_HINT = ("the tiled algorithm never creates a tensor of N × N elements (not even a boolean mask): "
           "compute scores, masks and probabilities one (block_q × block_k) tile at a time")
TILE_HINT = ("FlashAttention works on one (block_q × block_k) tile at a time: inside each query block, loop "
             "over the key blocks with the online softmax (backward: over the query blocks inside each key "
             "block), instead of scoring a query block against all N keys at once")
SDPA_HINT = "write the tiled loop yourself; torch's scaled_dot_product_attention does not count"
SCALE_HINT = ("S = τ q kᵀ with τ = 1/sqrt(d), so dq = τ dS k and dk = τ dSᵀ q: the factor τ is missing "
              "(or applied twice)")
DELTA_HINT = ("dS = P ∘ (dP − D) with D = rowsum(dO ∘ O), O being the normalised output o you are given "
              "(not the running, unnormalised one)")
DELTA_ZERO_HINT = ("dS = P ∘ (dP − D): the row term D = rowsum(dO ∘ O) is missing; it comes from the softmax's "
                   "normaliser and is computed once, before the loop, from o and dO")
DV_HINT = ("dv = Pᵀ dO, with P = exp(τ q kᵀ − lse) recomputed for each tile from the saved log-sum-exp "
           "(masked entries exactly 0)")
GRAD_NAN_HINT = ("P = exp(τ q kᵀ − lse) for each tile, its masked entries exactly 0 (exp(-inf) = 0); with "
                 "lse finite nothing overflows")
CAUSAL_GRAD_HINT = ("with causal=True, P_ij = 0 for keys j > i (and only those) in every tile: dv = Pᵀ dO, and "
                    "dS = P ∘ (dP − D) is 0 where P is")
SAVE_HINT = ("FlashAttention.forward saves exactly q, k, v, o and lse with ctx.save_for_backward, nothing "
             "else (no scores, no probabilities, no copies); the block sizes and causal go on ctx as attributes")
KERNEL_HINT = ("masked scores are -inf before the max (columns ≥ N, and after the row if causal); rows see key 0 "
               "first, so the running max is finite after the first block")
BOUNDS_HINT = ("every load and store of the last, ragged block needs a mask: mask=keys[:, None] < N with other=0.0 "
               "for the K and V blocks, mask=rows[:, None] < N for the Q block and the output. Masking the scores "
               "afterwards does not undo a load that already read past the end")


# --- inputs and references -------------------------------------------------------------------------
RISING, FALLING = 4.0, -4.0  # drifts of the keys


def _qkv(B, H, N, d, seed, drift=0.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g) for _ in range(3))
    if drift:  # positive queries, keys drifting up (RISING: each row's max grows from key block to key
        q = q.abs()  # block, so a missing rescale shows) or down (FALLING: the first block holds the max, so
        k = 0.5 * k + drift * torch.arange(N, dtype=torch.float32)[:, None] / N  # a missing rescale cannot)
    return q, k, v


def _causal_mask(n, shift=0):
    """True where key j is hidden from query i: j > i + shift (shift 0 is the causal mask)."""
    return torch.arange(n)[None, :] > torch.arange(n)[:, None] + shift


def _reference(q, k, v, causal, shift=0):
    q, k, v = (t.double() for t in (q, k, v))
    n, d = q.shape[-2:]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(_causal_mask(n, shift), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _reference_grads(q, k, v, do, causal):
    ins = [t.double().requires_grad_() for t in (q, k, v)]
    o, _ = _reference(*ins, causal)
    return torch.autograd.grad(o, ins, do.double())


# --- plausible mistakes, recomputed here to name the one made ------------------------------------
def _no_rescale(q, k, v, causal, bq, bk, rescale_sum):
    """The tiled forward without the exp(m − m') rescale of the running output (and of the running sum
    unless ``rescale_sum``), in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    n, d = q.shape[-2:]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], dtype=torch.float64)
    for i in range(0, n, bq):
        qi = q[..., i:i + bq, :] / math.sqrt(d)
        rows = torch.arange(i, i + qi.shape[-2])
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for j in range(0, n, bk):
            s = qi @ k[..., j:j + bk, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - shift[..., None])
            l = (torch.exp(m - shift) * l if rescale_sum else l) + p.sum(-1)
            acc = acc + p @ v[..., j:j + bk, :]
            m = m_new
        o[..., i:i + bq, :], lse[..., i:i + bq] = acc / l[..., None], m + torch.log(l)
    return o, lse


def _padded_keys(q, k, v, bk):
    """Keys padded with zeros to a multiple of ``bk`` and left unmasked (non-causal): each padded key adds
    exp(0 − m) to a row's sum and nothing to its output."""
    pad = (-q.shape[-2]) % bk
    if pad == 0:
        return None
    q, k, v = (t.double() for t in (q, k, v))
    k = torch.cat([k, k.new_zeros(*k.shape[:-2], pad, k.shape[-1])], dim=-2)
    v = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], dim=-2)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _forward_mistakes(q, k, v, causal, bq, bk) -> dict:
    """hint -> (o, lse) of a plausible wrong forward on these inputs."""
    found = {RESCALE_HINT: _no_rescale(q, k, v, causal, bq, bk, rescale_sum=False),
             f"{RESCALE_HINT} (the running output was not rescaled, the running sum was)":
                 _no_rescale(q, k, v, causal, bq, bk, rescale_sum=True)}
    if causal:
        found[f"{CAUSAL_HINT}: your mask lets row i see key i + 1"] = _reference(q, k, v, True, shift=1)
    else:
        padded = _padded_keys(q, k, v, bk)
        if padded is not None:
            found[f"{TAIL_HINT}: your last key block counts padding keys in the running sum"] = padded
    return found


def _mistakes_of(q, k, v, causal, bq, bk, index):
    """A function giving hint -> o (index 0) or lse (index 1) of the plausible wrong forwards, computed only
    when a comparison fails."""
    return lambda: {hint: found[index] for hint, found in _forward_mistakes(q, k, v, causal, bq, bk).items()}


def _grad_formula(q, k, v, do, causal, delta="o", shift=0):
    """dq, dk, dv from the FlashAttention formulas in float64, with D = rowsum(dO ∘ O) ("o"), 0 ("zero") or
    rowsum(dO ∘ O) · exp(lse) ("unnormalised"), and P masked for keys j > i + ``shift``."""
    q, k, v, do = (t.double() for t in (q, k, v, do))
    n, d = q.shape[-2:]
    tau = 1 / math.sqrt(d)
    o, lse = _reference(q, k, v, causal)
    s = q @ k.transpose(-2, -1) * tau
    if causal:
        s = s.masked_fill(_causal_mask(n, shift), float("-inf"))
    p = torch.exp(s - lse[..., None])
    D = {"o": (do * o).sum(-1), "zero": torch.zeros_like(lse), "unnormalised": (do * o).sum(-1) * torch.exp(lse)}[delta]
    ds = p * (do @ v.transpose(-2, -1) - D[..., None])
    return tau * ds @ k, tau * ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ do


def _is(got, candidate) -> bool:
    return (isinstance(got, torch.Tensor) and isinstance(candidate, torch.Tensor) and got.shape == candidate.shape
            and same_close(got.double(), candidate.double(), **MISTAKE_TOL))


# --- comparisons -------------------------------------------------------------------------------------
def _finite(t, name, where, hint=NAN_HINT):
    if isinstance(t, torch.Tensor) and not torch.isfinite(t).all():
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise AssertionError(f"{where}: {name} contains NaN or inf (first at index {tuple(bad)}). {hint}")


def _check_dtype(got, dtype, name, where, hint):
    if isinstance(got, torch.Tensor) and got.dtype != dtype:
        raise AssertionError(f"{where}: {name} has dtype {got.dtype}, expected {dtype}. {hint}")


def _close(got, ref, name, where, hint, tol=TOL, mistakes=None, nan_hint=NAN_HINT):
    """check_close against ``ref`` (already in the expected dtype); when it fails and ``got`` is one of
    ``mistakes`` (hint -> value), that mistake's hint replaces ``hint``."""
    _finite(got, name, where, nan_hint)
    if isinstance(got, torch.Tensor) and got.shape == ref.shape and not same_close(got.double(), ref.double(), **tol):
        for mistake_hint, candidate in (mistakes() if callable(mistakes) else mistakes or {}).items():
            if _is(got, candidate):
                hint = mistake_hint
                break
    check_close(got, ref, f"{name} {where}", hint, **tol)


def _trace(nb, fn_name, *args):
    return fetch(nb.apply(probes.ch10_trace, nb[fn_name], *args))


def _pair(result, where, what):
    if not isinstance(result, (tuple, list)) or len(result) != len(what):
        raise AssertionError(f"{where}: expected a tuple ({', '.join(what)}), got {type(result).__name__}")
    return result


def _check_fused(traced, where):
    if any("scaled_dot_product" in op for op in traced["ops"]):
        raise AssertionError(f"{where}: scaled_dot_product_attention was called. {SDPA_HINT}")


def _check_no_nxn(traced, n, where):
    _check_fused(traced, where)
    if traced["max_elements"] >= n * n:
        raise AssertionError(f"{where}: a tensor of shape {tuple(traced['max_shape'])} "
                             f"({traced['max_elements']:,} elements ≥ N² = {n * n:,}) was created. {NN_HINT}")


# --- long sequences: the memory cells --------------------------------------------------------------
# The forward and backward memory cells: (1, MEMORY_HEADS, N, MEMORY_D), N drawn at grading time in MEMORY_N
# (a multiple of the blocks: ragged blocks are the edge-case cells'), non-causal, blocks of MEMORY_BLOCK.
# With d = 16 and blocks of 128 a row of tiles (one query block's scores against all N keys) is eight
# times o, so the band below separates tile-by-tile code from a whole row or column of tiles at once.
MEMORY_N, MEMORY_HEADS, MEMORY_D, MEMORY_BLOCK = (3072, 4096), 4, 16, 128
ROWS = 16  # rows a check of a long sequence compares, drawn at grading time


def _draw_rows(n: int) -> list[int]:
    """ROWS distinct row indices in [0, n), drawn at grading time."""
    rows: set = set()
    while len(rows) < min(ROWS, n):
        rows.add(draw(0, n - 1))
    return sorted(rows)


def _rows_reference(q, k, v, rows, causal=False):
    """o and lse (float64) of the query rows ``rows`` only: the reference on a long sequence."""
    q, k, v = (t.double() for t in (q, k, v))
    n, d = q.shape[-2:]
    index = torch.tensor(rows, dtype=torch.long)
    s = q[:, :, index] @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.arange(n)[None, :] > index[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _full_reference(q, k, v, chunk=512):
    """Non-causal o and lse of a long sequence in float32 (inputs of a backward, and what its reference is
    computed from), ``chunk`` query rows at a time."""
    q, k, v = (t.float() for t in (q, k, v))
    n, d = q.shape[-2:]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1])
    for i in range(0, n, chunk):
        s = q[:, :, i:i + chunk] @ k.transpose(-2, -1) / math.sqrt(d)
        m = s.amax(dim=-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        lse[:, :, i:i + chunk] = (m + torch.log(l)).squeeze(-1)
        o[:, :, i:i + chunk] = (p @ v) / l
    return o, lse


def _grad_rows(q, k, v, o, lse, do, rows):
    """dq at the query rows ``rows`` and dk, dv at the key rows ``rows`` (float64), by the formulas of
    FlashAttention's backward from the o and lse given (non-causal): P = exp(τ q kᵀ − lse), D = rowsum(dO ∘ O),
    dS = P ∘ (dO vᵀ − D), dq = τ dS k, dk = τ dSᵀ q, dv = Pᵀ dO."""
    q, k, v, o, lse, do = (t.double() for t in (q, k, v, o, lse, do))
    tau = 1 / math.sqrt(q.shape[-1])
    index = torch.tensor(rows, dtype=torch.long)
    D = (do * o).sum(-1)
    p = torch.exp(q[:, :, index] @ k.transpose(-2, -1) * tau - lse[:, :, index, None])  # (B, H, R, N)
    dq = tau * (p * (do[:, :, index] @ v.transpose(-2, -1) - D[:, :, index, None])) @ k
    p = torch.exp(q @ k[:, :, index].transpose(-2, -1) * tau - lse[..., None])  # (B, H, N, R)
    ds = p * (do @ v[:, :, index].transpose(-2, -1) - D[..., None])
    return dq, tau * ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ do


def _fetch_rows(nb, rows, *values):
    """Rows ``rows`` of values that stay in the student's process (probes.ch10_rows)."""
    return fetch(nb.apply(probes.ch10_rows, rows, *values))


def _check_rows(got, ref, name, shape, where, rows, hint, tol=TOL, nan_hint=NAN_HINT):
    """A tensor's rows as fetched by ``_fetch_rows`` (the whole tensor's shape and dtype with them) against
    the reference rows ``ref``; float32 expected."""
    if "type" in got:
        raise AssertionError(f"{where}: {name} is a {got['type']}, expected a torch.Tensor")
    if tuple(got["shape"]) != tuple(shape):
        raise AssertionError(f"{where}: {name} has shape {tuple(got['shape'])}, expected {tuple(shape)}")
    if got["dtype"] != "torch.float32":
        raise AssertionError(f"{where}: {name} has dtype {got['dtype']}, expected torch.float32")
    _close(got["rows"], ref.float(), f"{name} (its rows {', '.join(map(str, rows))}, drawn at grading time)", where,
           hint, tol, nan_hint=nan_hint)


def _explain_peak(nb, fn_name, args, n, heads) -> str:
    """Why a call held too much, from a traced call on ``args()`` (the same shapes) run after the reading
    decided (the op trace only explains): the largest tensor it created, if that is N × N or a whole row or
    column of tiles."""
    try:
        traced = _trace(nb, fn_name, *args())
    except Exception:  # noqa: BLE001 - an explanation only
        return f"{NN_HINT}; {TILE_HINT}"
    found = f"its largest tensor has shape {tuple(traced['max_shape'])} ({traced['max_elements']:,} elements)"
    if traced["max_elements"] >= n * n:
        return f"Traced on the same shape, {found}, N² = {n * n:,} or more. {NN_HINT}"
    if traced["max_elements"] >= heads * MEMORY_BLOCK * n:
        return f"Traced on the same shape, {found}: a whole row or column of tiles. {TILE_HINT}"
    return f"{NN_HINT}; {TILE_HINT}"


def _check_band(nb, held, fn_name, shape, args, outputs: int, outputs_named: str):
    """The peak of a memory call on a long sequence, read from outside the process: at most the outputs
    and one and a half rows of tiles beyond what the process held before. ``args()`` makes arguments of the
    same shapes for the trace that explains a failure."""
    B, H, n, d = shape
    row = B * H * MEMORY_BLOCK * n * 4
    if held.peak > outputs + row * 3 // 2:
        raise AssertionError(
            f"{fn_name} on (B, H, N, d) = {shape}, non-causal, blocks of {MEMORY_BLOCK}: while it ran, your process "
            f"grew by {mib(held.peak)} (read from outside your process); {outputs_named} are {mib(outputs)}, one row "
            f"of tiles ({H} heads × {MEMORY_BLOCK} × N float32 scores) {mib(row)}, the bound {outputs_named} and 1.5 "
            f"rows of tiles. {_explain_peak(nb, fn_name, args, n, B * H)}")


def _gate(nb, fn_name, make_args, compare, values_of_causal):
    """The shortcut gate of every forward and backward cell: traced calls at N = GATE_N, causal and not, where
    no tensor of N² elements and no fused attention may appear. ``compare(traced, causal)`` checks the values
    the call returned against the judge's reference: the non-causal call's in every cell, the causal call's
    when ``values_of_causal`` (the edge-case cells, which grade causal masking)."""
    for causal in (False, True):
        traced = _trace(nb, fn_name, *make_args(causal))
        _check_no_nxn(traced, GATE_N, f"in {fn_name} (N = {GATE_N}, causal={causal}, blocks 32 and 16)")
        if values_of_causal or not causal:
            compare(traced, causal)


# --- forward -----------------------------------------------------------------------------------------
def _forward_check(traced, q, k, v, shape, causal, bq, bk, hint=ONLINE_HINT, dtype=torch.float32):
    kind = "" if dtype == torch.float32 else f" {str(dtype).removeprefix('torch.')}"
    where = f"for{kind} (B, H, N, d) = {shape}, causal={causal}, block_q={bq}, block_k={bk}"
    _check_fused(traced, where)
    o, lse = _pair(traced["result"], where, ("o", "lse"))
    o_ref, lse_ref = _reference(q, k, v, causal)
    work = torch.promote_types(dtype, torch.float32)
    _check_dtype(o, dtype, "o", where, DTYPE_HINT)
    _check_dtype(lse, work, "lse", where, DTYPE_HINT)
    tol = DTYPE_TOL[dtype]
    nan_hint = NAN_HINT if causal else OVERFLOW_HINT
    _close(o, o_ref.to(dtype), "o", where, hint, tol, _mistakes_of(q, k, v, causal, bq, bk, 0), nan_hint)
    _close(lse, lse_ref.to(work), "lse", where, LSE_HINT, tol, _mistakes_of(q, k, v, causal, bq, bk, 1), nan_hint)


def _forward_case(nb, shape, causal, bq, bk, seed, drift=0.0, hint=ONLINE_HINT, dtype=torch.float32):
    q, k, v = (t.to(dtype) for t in _qkv(*shape, seed=seed, drift=drift))
    traced = _trace(nb, "flash_attention_forward", q, k, v, causal, bq, bk)
    _forward_check(traced, q, k, v, shape, causal, bq, bk, hint, dtype)
    return traced


def _forward_gate(nb, values_of_causal=False):
    # Every row's maximum lies in its first key block (FALLING, checked for this seed): a missing rescale, the
    # values cell's property, cannot show here.
    shape = (1, 2, GATE_N, 16)
    q, k, v = _qkv(*shape, seed=9, drift=FALLING)
    _gate(nb, "flash_attention_forward", lambda causal: (q, k, v, causal, 32, 16),
          lambda traced, causal: _forward_check(traced, q, k, v, shape, causal, 32, 16,
                                                CAUSAL_HINT if causal else ONLINE_HINT),
          values_of_causal)


@hidden_test("test_flash_attention_forward")
def check_forward_values(nb):
    # Non-causal, N a multiple of the blocks: one block covering everything (plain softmax attention), then
    # several key blocks with every row's max rising along them, block_q above and below block_k.
    _forward_case(nb, (2, 3, 64, 16), False, 64, 64, seed=1, hint=SINGLE_BLOCK_HINT)
    _forward_case(nb, (1, 2, 64, 16), False, 64, 8, seed=2, drift=RISING, hint=RESCALE_HINT)
    _forward_case(nb, (2, 2, 96, 16), False, 32, 32, seed=3, drift=RISING, hint=RESCALE_HINT)
    _forward_case(nb, (1, 2, 96, 16), False, 16, 32, seed=4)
    _forward_gate(nb)  # last here: a wrong value is first named by the cases above, which aim at it


@hidden_test("test_flash_attention_forward_edge_cases")
def check_forward_edge_cases(nb):
    _forward_gate(nb, values_of_causal=True)
    # Where there are several key blocks, every row's max is in its first one (FALLING): the rescale, graded
    # by the values cell, cannot interfere here.
    # Ragged last blocks: a block larger than N, several blocks with a short last one.
    _forward_case(nb, (2, 3, 37, 16), False, 64, 64, seed=11, hint=TAIL_HINT)
    _forward_case(nb, (1, 2, 37, 16), False, 64, 8, seed=12, drift=FALLING, hint=TAIL_HINT)
    _forward_case(nb, (2, 2, 100, 16), False, 32, 32, seed=13, drift=FALLING, hint=TAIL_HINT)
    _forward_case(nb, (1, 2, 100, 16), False, 32, 16, seed=14, drift=FALLING, hint=TAIL_HINT)
    # Causal: the diagonal inside tiles, whole rows of a tile masked (block_q > block_k), the reverse.
    _forward_case(nb, (1, 3, 96, 16), True, 32, 32, seed=15, drift=FALLING, hint=CAUSAL_HINT)
    _forward_case(nb, (2, 2, 70, 16), True, 32, 16, seed=16, drift=FALLING, hint=CAUSAL_HINT)
    _forward_case(nb, (1, 2, 70, 16), True, 16, 32, seed=17, drift=FALLING, hint=CAUSAL_HINT)
    _forward_case(nb, (1, 1, 37, 16), True, 64, 8, seed=18, drift=FALLING, hint=CAUSAL_HINT)
    _forward_case(nb, (1, 2, 100, 16), True, 32, 16, seed=19, drift=FALLING, hint=CAUSAL_HINT)
    # The dtypes the docstring promises: float64 accumulates in float64, float16 in float32.
    _forward_case(nb, (1, 2, 70, 16), True, 32, 16, seed=20, drift=FALLING, dtype=torch.float64, hint=DTYPE_HINT)
    _forward_case(nb, (1, 2, 70, 16), False, 32, 16, seed=21, drift=FALLING, dtype=torch.float16, hint=DTYPE_HINT)


@hidden_test("test_flash_attention_forward_memory")
def check_forward_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    _forward_gate(nb)
    n, block = draw(*MEMORY_N, multiple_of=MEMORY_BLOCK), MEMORY_BLOCK
    shape = (1, MEMORY_HEADS, n, MEMORY_D)
    seeds = [new_seed() for _ in range(3)]
    # Warm: every code path once (the first call loads code pages), its values checked.
    _forward_case(nb, (1, MEMORY_HEADS, 2 * block, MEMORY_D), False, block, block, seed=22)
    held, result = meter.held_by(
        nb.flash_attention_forward,
        inputs=lambda: [*(meter.tensor(shape, requires_grad=False, seed=s) for s in seeds), False, block, block])
    B, H, _, d = shape
    _check_band(nb, held, "flash_attention_forward", shape,
                lambda: [*(fresh_tensor(nb, shape, requires_grad=False) for _ in range(3)), False, block, block],
                4 * (B * H * n * d + B * H * n), "o and lse")
    # The values of the very call measured, on rows drawn now.
    rows = _draw_rows(n)
    o_ref, lse_ref = _rows_reference(*(seeded(shape, seed=s) for s in seeds), rows)
    where = f"for (B, H, N, d) = {shape}, causal=False, block_q={block}, block_k={block}"
    got = _fetch_rows(nb, rows, result)[0]
    if not isinstance(got, list) or len(got) != 2:
        raise AssertionError(f"{where}: expected a tuple (o, lse)")
    _check_rows(got[0], o_ref, "o", shape, where, rows, ONLINE_HINT, nan_hint=OVERFLOW_HINT)
    _check_rows(got[1], lse_ref, "lse", shape[:3], where, rows, LSE_HINT, nan_hint=OVERFLOW_HINT)


# --- backward ----------------------------------------------------------------------------------------
def _backward_inputs(shape, causal, seed, dtype=torch.float32):
    q, k, v = (t.to(dtype) for t in _qkv(*shape, seed=seed))
    do = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100)).to(dtype)
    o, lse = _reference(q, k, v, causal)
    return q, k, v, o.to(dtype), lse.to(torch.promote_types(dtype, torch.float32)), do


def _backward_check(traced, q, k, v, do, shape, causal, bq, bk, dtype=torch.float32):
    kind = "" if dtype == torch.float32 else f" {str(dtype).removeprefix('torch.')}"
    where = f"for{kind} (B, H, N, d) = {shape}, causal={causal}, block_q={bq}, block_k={bk}"
    _check_fused(traced, where)
    grads = _pair(traced["result"], where, ("dq", "dk", "dv"))
    refs = _reference_grads(q, k, v, do, causal)
    for name, g in zip(("dq", "dk", "dv"), grads):
        _check_dtype(g, dtype, name, where, GRAD_DTYPE_HINT)
        _finite(g, name, where, GRAD_NAN_HINT)
    tol = GRAD_DTYPE_TOL[dtype]

    def mistakes(index):
        def found():
            out = {DELTA_ZERO_HINT: _grad_formula(q, k, v, do, causal, delta="zero")[index],
                   DELTA_HINT: _grad_formula(q, k, v, do, causal, delta="unnormalised")[index]}
            if causal:
                out[f"{CAUSAL_GRAD_HINT}; yours lets row i see key i + 1"] = _grad_formula(
                    q, k, v, do, True, shift=1)[index]
            return out
        return found

    _close(grads[2], refs[2].to(dtype), "dv", where, f"{DV_HINT}; {CAUSAL_GRAD_HINT}" if causal else DV_HINT, tol,
           mistakes(2), GRAD_NAN_HINT)
    d = shape[-1]
    for index, name, g, r in zip((0, 1), ("dq", "dk"), grads[:2], refs[:2]):
        if isinstance(g, torch.Tensor) and g.shape == r.shape:
            for factor in (math.sqrt(d), 1 / math.sqrt(d)):  # τ missing, or applied twice
                if same_close(g.double(), r * factor, **MISTAKE_TOL):
                    raise AssertionError(f"{name} {where} is the reference times {factor:.3g}. {SCALE_HINT}")
        _close(g, r.to(dtype), name, where, f"{DELTA_HINT}; {CAUSAL_GRAD_HINT}" if causal else DELTA_HINT, tol,
               mistakes(index), GRAD_NAN_HINT)


def _backward_case(nb, shape, causal, bq, bk, seed, dtype=torch.float32):
    q, k, v, o, lse, do = _backward_inputs(shape, causal, seed, dtype)
    traced = _trace(nb, "flash_attention_backward", q, k, v, o, lse, do, causal, bq, bk)
    _backward_check(traced, q, k, v, do, shape, causal, bq, bk, dtype)
    return traced


def _backward_gate(nb, values_of_causal=False):
    shape = (1, 2, GATE_N, 16)
    inputs = {causal: _backward_inputs(shape, causal, seed=10) for causal in (False, True)}
    _gate(nb, "flash_attention_backward", lambda causal: (*inputs[causal], causal, 32, 16),
          lambda traced, causal: _backward_check(traced, *inputs[causal][:3], inputs[causal][5], shape, causal, 32,
                                                 16),
          values_of_causal)


@hidden_test("test_flash_attention_backward")
def check_backward_values(nb):
    _backward_gate(nb)
    # Non-causal, N a multiple of the blocks: one tile covering everything, then several of each.
    _backward_case(nb, (1, 2, 64, 16), False, 64, 64, seed=11)
    _backward_case(nb, (2, 2, 96, 16), False, 32, 32, seed=12)
    _backward_case(nb, (1, 2, 96, 16), False, 16, 32, seed=13)
    _backward_case(nb, (1, 3, 96, 16), False, 32, 16, seed=14)


@hidden_test("test_flash_attention_backward_edge_cases")
def check_backward_edge_cases(nb):
    _backward_gate(nb, values_of_causal=True)
    # Ragged last blocks (one block larger than N), then causal with block_q above, equal to and below block_k.
    _backward_case(nb, (1, 2, 37, 16), False, 64, 64, seed=21)
    _backward_case(nb, (2, 2, 100, 16), False, 32, 32, seed=22)
    _backward_case(nb, (1, 2, 96, 16), True, 32, 32, seed=23)
    _backward_case(nb, (1, 3, 77, 16), True, 32, 16, seed=24)
    _backward_case(nb, (2, 1, 70, 16), True, 16, 32, seed=25)
    _backward_case(nb, (1, 2, 100, 16), True, 32, 32, seed=26)
    # float64 inputs: float64 gradients, accumulated in float64.
    _backward_case(nb, (1, 2, 70, 16), True, 32, 16, seed=27, dtype=torch.float64)


@hidden_test("test_flash_attention_backward_memory")
def check_backward_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    _backward_gate(nb)
    n, block = draw(*MEMORY_N, multiple_of=MEMORY_BLOCK), MEMORY_BLOCK
    shape = (1, MEMORY_HEADS, n, MEMORY_D)
    seeds = [new_seed() for _ in range(4)]  # q, k, v, do
    q, k, v, do = (seeded(shape, seed=s) for s in seeds)
    o32, lse32 = _full_reference(q, k, v)  # the forward's outputs, sent as inputs
    # Warm: every code path once (the first call loads code pages), its values checked.
    _backward_case(nb, (1, MEMORY_HEADS, 2 * block, MEMORY_D), False, block, block, seed=28)

    def inputs():
        made = [meter.tensor(shape, requires_grad=False, seed=s) for s in seeds]
        return [*made[:3], meter.put(o32), meter.put(lse32), made[3], False, block, block]

    held, result = meter.held_by(nb.flash_attention_backward, inputs=inputs)
    B, H, _, d = shape

    def explain_args():
        return [*(fresh_tensor(nb, shape, requires_grad=False) for _ in range(4)),
                fresh_tensor(nb, shape[:3], requires_grad=False), fresh_tensor(nb, shape, requires_grad=False), False,
                block, block]

    _check_band(nb, held, "flash_attention_backward", shape, explain_args, 3 * 4 * B * H * n * d, "dq, dk and dv")
    # The values of the very call measured, on rows drawn now: dq at those query rows, dk and dv at those keys.
    rows = _draw_rows(n)
    refs = _grad_rows(q, k, v, o32, lse32, do, rows)
    where = f"for (B, H, N, d) = {shape}, causal=False, block_q={block}, block_k={block}"
    got = _fetch_rows(nb, rows, result)[0]
    if not isinstance(got, list) or len(got) != 3:
        raise AssertionError(f"{where}: expected a tuple (dq, dk, dv)")
    for name, g, r, hint in zip(("dq", "dk", "dv"), got, refs, (DELTA_HINT, DELTA_HINT, DV_HINT)):
        _check_rows(g, r, name, shape, where, rows, hint, GRAD_TOL, GRAD_NAN_HINT)


# --- the autograd Function -----------------------------------------------------------------------
def _function_where(shape, extra):
    args = ", ".join(["q", "k", "v", *map(str, extra)])
    return f"for FlashAttention.apply({args}) with (B, H, N, d) = {shape}"


def _function_run(nb, shape, seed, extra, backward=True):
    """Forward (and backward) through FlashAttention.apply; the output checked attached (and, with
    ``backward``, right)."""
    causal = bool(extra[0]) if extra else False
    q, k, v = _qkv(*shape, seed=seed)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 100))
    where = _function_where(shape, extra)
    run = fetch(nb.apply(probes.ch10_autograd_run, nb.FlashAttention.apply, q, k, v, do, *extra,
                         backward=backward))
    if not run["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph; forward must return o "
                             "computed from its inputs inside a torch.autograd.Function")
    if not backward:
        return run, (q, k, v, do, causal)
    o_ref, _ = _reference(q, k, v, causal)
    hint = "forward returns o from flash_attention_forward(q, k, v, causal, block_q, block_k)"
    if isinstance(run["o"], torch.Tensor) and run["o"].shape == o_ref.shape \
            and not same_close(run["o"].double(), o_ref, **TOL) \
            and _own_result_is(nb, "flash_attention_forward", run["o"], 0, q, k, v, *_blocks(extra)):
        hint = ("your flash_attention_forward returns this output for these arguments: fix it first (its test "
                "cells say what is wrong); FlashAttention only wires it in")
    _close(run["o"], o_ref.float(), "the output", where, hint)
    return run, (q, k, v, do, causal)


def _blocks(extra):
    """(causal, block_q, block_k) of an apply call, with the defaults filled in."""
    full = list(extra) + [False, 32, 32][len(extra):]
    return tuple(full[:3])


def _own_result_is(nb, fn_name, got, index, *args) -> bool:
    """Whether the student's own ``fn_name(*args)`` gives ``got`` as its ``index``-th result."""
    try:
        result = fetch(nb.apply(probes.ch10_trace, nb[fn_name], *args))["result"]
    except Exception:  # noqa: BLE001 - a function that raises does not give this result
        return False
    return isinstance(result, (tuple, list)) and len(result) > index and _is(got, result[index])


@hidden_test("test_FlashAttention")
def check_function_values(nb):
    for shape, seed, extra in (((2, 2, 70, 16), 21, (False, 32, 32)), ((1, 3, 77, 16), 22, (True, 16, 32)),
                               ((1, 2, 45, 32), 23, ()), ((1, 2, 45, 16), 24, (True,))):
        run, (q, k, v, do, causal) = _function_run(nb, shape, seed, extra)
        where = _function_where(shape, extra)
        o_ref, lse_ref = _reference(q, k, v, causal)
        for index, name, g, r in zip(range(3), ("q", "k", "v"), run["grads"], _reference_grads(q, k, v, do, causal)):
            if g is None:
                raise AssertionError(f"{where}: no gradient reached {name}: backward returns (dq, dk, dv, None, "
                                     "None, None), one gradient per input of forward")
            hint = ("backward calls flash_attention_backward with what forward saved and the same causal flag and "
                    "block sizes")
            if isinstance(g, torch.Tensor) and g.shape == r.shape and not same_close(g.double(), r, **GRAD_TOL) \
                    and _own_result_is(nb, "flash_attention_backward", g, index, q, k, v, o_ref.float(),
                                       lse_ref.float(), do, *_blocks(extra)):
                hint = ("your flash_attention_backward returns this gradient for these arguments: fix it first (its "
                        "test cells say what is wrong); FlashAttention only wires it in")
            _close(g, r.float(), f"the gradient of {name}", where, hint, GRAD_TOL, nan_hint=GRAD_NAN_HINT)


# The memory cell's long sequence: (1, 1, N, FUNCTION_D), N drawn at grading time in FUNCTION_N, non-causal,
# blocks of FUNCTION_BLOCK.
FUNCTION_N, FUNCTION_D, FUNCTION_BLOCK = (2048, 3072), 64, 128


def _saved_explanation(nb) -> str:
    """What forward saved for backward on a small input, counted inside the student's process: read only after
    the outside reading decided, to explain its failure (never a reason on its own)."""
    shape, seed, extra = (2, 2, 70, 16), 31, (False, 32, 32)
    try:
        run, _ = _function_run(nb, shape, seed, extra, backward=False)
    except Exception:  # noqa: BLE001 - an explanation is optional; the reading above decided
        return ""
    B, H, N, d = shape
    expected = 4 * (4 * B * H * N * d + B * H * N)
    shapes = sorted(map(tuple, (s["shape"] for s in run["saved"])))
    want = sorted([(B, H, N, d)] * 4 + [(B, H, N)])
    if run["activation_bytes"] == expected and shapes == want:
        return (" Saved-tensor hooks inside your process saw exactly q, k, v, o and lse saved: what else is held "
                "(a ctx attribute, a global, a list) is not saved for backward, so it does not show there.")
    return (f" Inside your process, {_function_where(shape, extra)[4:]}, {run['activation_bytes']:,} bytes were "
            f"saved for backward in tensors of shapes {shapes}; q, k, v, o and lse are {expected:,} bytes in {want}.")


@hidden_test("test_FlashAttention_memory")
def check_function_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    # What the graph holds once forward returned, read from outside the process, on a long sequence; then
    # backward through it, its gradients compared with the judge's on rows drawn now.
    n, d, block = draw(*FUNCTION_N, multiple_of=FUNCTION_BLOCK), FUNCTION_D, FUNCTION_BLOCK
    shape = (1, 1, n, d)
    seeds = [new_seed() for _ in range(4)]  # q, k, v and the weights of the loss
    _function_run(nb, (1, 1, 2 * block, d), 30, (False, block, block))  # warm: every code path once, checked
    made = [meter.tensor(shape, seed=s) for s in seeds[:3]]  # held across the call: booked
    q, k, v = (m.tensor for m in made)
    for t in (q, k, v):
        t.retain_grad()  # dq, dk and dv land in .grad
    call = f"FlashAttention.apply(q, k, v, False, {block}, {block}) on (B, H, N, d) = {shape}"
    held, o = meter.held_by(lambda: nb.FlashAttention.apply(q, k, v, False, block, block))
    square, outputs = n * n * 4, 4 * (n * d + n)
    if held.kept >= outputs + square // 4:
        raise AssertionError(
            f"{call}: once it returned, your process held {mib(held.kept)} more (read from outside your process), "
            f"with q, k, v already held; o and lse are {mib(outputs)}, one N × N float32 tensor {mib(square)}. "
            f"{SAVE_HINT}{_saved_explanation(nb)}")
    run = fetch(nb.apply(probes.ch10_backward, o, fresh_tensor(nb, shape, requires_grad=False, seed=seeds[3])))
    if not run["attached"]:
        raise AssertionError(f"{call}: the output is not a tensor attached to the autograd graph; forward must "
                             "return o computed from its inputs inside a torch.autograd.Function")
    rows = _draw_rows(n)
    qj, kj, vj, weight = (seeded(shape, seed=s) for s in seeds)
    o_full, lse_full = _full_reference(qj, kj, vj)
    refs = [o_full[:, :, rows], *_grad_rows(qj, kj, vj, o_full, lse_full, weight, rows)]
    got = _fetch_rows(nb, rows, o, q.grad, k.grad, v.grad)
    where = f"for {call}, backward from the loss sum(o * w)"
    hint = "FlashAttention wires in your flash_attention_forward and flash_attention_backward, saving q, k, v, o, lse"
    for name, g, r, tol in zip(("o", "the gradient of q", "the gradient of k", "the gradient of v"), got, refs,
                               (TOL, GRAD_TOL, GRAD_TOL, GRAD_TOL)):
        _check_rows(g, r, name, shape, where, rows, hint, tol, GRAD_NAN_HINT)


# --- the Triton kernel ---------------------------------------------------------------------------
TRITON_BLOCK = 32  # the launcher's blocks
# The torch operators a launcher may run while the call runs: allocate, view and copy (contiguous(), clone(),
# to()), read a shape or a scalar. Everything else (arithmetic, matrix products, exp, reductions, in-place
# writes) would compute in PyTorch what the kernel must compute.
TRITON_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "expand", "permute", "transpose", "t",
    "select", "slice", "narrow", "unsqueeze", "squeeze", "flatten", "unflatten", "unbind", "split",
    "split_with_sizes", "chunk", "movedim", "view_as", "detach", "alias", "contiguous", "clone", "_to_copy", "to",
    "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
})
TRITON_MEMORY_N = (768, 1024)  # N of the Triton memory cell, drawn at grading time
KERNEL_COMPUTES_HINT = ("the attention must be computed by your Triton kernel: launch it once (launch_flash_forward "
                        "does), let it load q, k and v and store every row of o (mask=rows[:, None] < N); around the "
                        "launch PyTorch only allocates, views or copies tensors")


def _check_kernel_computes(run: dict, where: str, traced: bool = True) -> None:
    """The rules of every Triton call: the interpreter as Triton ships it, one launch, no torch operator but
    those of TRITON_OPS (``traced`` calls), loads from q, k and v only (``traced`` calls: copies of them are
    followed through the trace), and the returned o written, every element of it, by the kernel's stores
    and nothing else written."""
    bounds = run["bounds"]
    tampered = bounds.get("tampered")
    if tampered:
        raise AssertionError(f"{where}: your code changed Triton's interpreter ({tampered}); the grader runs your "
                             "kernel in the interpreter as Triton ships it")
    if bounds["launches"] != 1:
        found = "no Triton kernel was launched" if bounds["launches"] == 0 else \
            f"{bounds['launches']} Triton kernels were launched"
        raise AssertionError(f"{where}: {found}; {KERNEL_COMPUTES_HINT}")
    if traced:
        used = sorted(set(run["ops"]) - TRITON_OPS)
        if used:
            raise AssertionError(f"{where}: PyTorch ran {', '.join(used)} during the call; {KERNEL_COMPUTES_HINT}")
        if bounds["foreign_loads"]:
            raise AssertionError(f"{where}: your kernel loaded {', '.join(bounds['foreign_loads'])}, which is not q, "
                                 f"k or v; {KERNEL_COMPUTES_HINT}")
    if not bounds["result_stored"]:
        raise AssertionError(f"{where}: the tensor returned is not one your kernel stored into; "
                             f"{KERNEL_COMPUTES_HINT}")
    if bounds["unwritten"]:
        raise AssertionError(f"{where}: {bounds['unwritten']:,} elements of o (the first at index "
                             f"{tuple(bounds['first_unwritten'])}) were never written by your kernel's stores; "
                             f"{KERNEL_COMPUTES_HINT}")
    others = [name for name in bounds["stored"] if name != bounds["result_argument"]]
    if others:
        raise AssertionError(f"{where}: your kernel also stored into {', '.join(others)}; it stores o only. "
                             f"{KERNEL_COMPUTES_HINT}")


def _triton_case(nb, shape, causal, seed, drift=0.0, hint=KERNEL_HINT, compare=True, spaced=False):
    """One call in the interpreter under probes.ch10_triton_run; the rules of _check_kernel_computes and no
    N × N tensor, o compared with float64 attention when ``compare``; q, k, v apart from each other when
    ``spaced``."""
    q, k, v = _qkv(*shape, seed=seed, drift=drift)
    where = f"for flash_attention_triton with (B, H, N, d) = {shape}, causal={causal}"
    run = fetch(nb.apply(probes.ch10_triton_run, nb.flash_attention_triton, q, k, v, causal, spaced=spaced))
    _check_kernel_computes(run, where)
    B, H, N, d = shape
    if B * H * N * d < N * N:  # only then is a tensor of N² elements more than the output
        _check_no_nxn(run, N, f"in flash_attention_triton (N = {N}, causal={causal})")
    if compare:
        o_ref, _ = _reference(q, k, v, causal)
        _close(run["result"], o_ref.float(), "o", where, hint, TOL,
               _mistakes_of(q, k, v, causal, TRITON_BLOCK, TRITON_BLOCK, 0), f"{NAN_HINT}; {KERNEL_HINT}")
    return run, where


@hidden_test("test_flash_attention_triton")
def check_triton_values(nb):
    _triton_case(nb, (1, 2, 100, 16), False, 31, drift=RISING, hint=f"{RESCALE_HINT}; {KERNEL_HINT}")  # 4 key blocks
    _triton_case(nb, (1, 2, 100, 16), True, 32, hint=f"{CAUSAL_HINT}; {KERNEL_HINT}")
    _triton_case(nb, (1, 1, 70, 32), True, 33, drift=RISING, hint=f"{CAUSAL_HINT}; {RESCALE_HINT}; {KERNEL_HINT}")


@hidden_test("test_flash_attention_triton_memory")
def check_triton_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    n, d = draw(*TRITON_MEMORY_N), 16  # causal: half the tiles in the interpreter
    shape = (1, 1, n, d)
    seeds = [new_seed() for _ in range(3)]
    _triton_case(nb, (1, 1, 256, d), True, 34)  # warm: every code path once, its values checked
    # The measured call runs in the interpreter with its accesses checked (lanes outside a tensor switched off,
    # which stores wrote recorded), not traced: no probe measures anything inside the window.
    held, run = meter.held_by(
        lambda *args: nb.apply(probes.ch10_triton_run, nb.flash_attention_triton, *args, trace=False),
        inputs=lambda: [*(meter.tensor(shape, requires_grad=False, seed=s) for s in seeds), True])
    where = f"flash_attention_triton on (B, H, N, d) = {shape}, causal"
    _check_kernel_computes({"bounds": fetch(run["bounds"])}, f"for {where}", traced=False)
    square = n * n * 4
    if held.peak >= square:
        raise AssertionError(
            f"{where}: while it ran, your process grew by {mib(held.peak)} (read from outside your process), as "
            f"much as one N × N float32 tensor ({mib(square)}) or more; the inputs together are "
            f"{mib(3 * n * d * 4)}. The kernel keeps one BLOCK_M × BLOCK_N tile of scores at a time (blocks of "
            f"32 × 32), never a tile of N × N. {NN_HINT}")
    rows = _draw_rows(n)
    o_ref, _ = _rows_reference(*(seeded(shape, seed=s) for s in seeds), rows, causal=True)
    got = _fetch_rows(nb, rows, run["result"])[0]
    _check_rows(got, o_ref, "o", shape, f"for {where}", rows, f"{CAUSAL_HINT}; {KERNEL_HINT}",
                nan_hint=f"{NAN_HINT}; {KERNEL_HINT}")


def _describe_violation(found: dict, d: int) -> str:
    op = {"load": "a tl.load", "store": "a tl.store", "atomic": "an atomic"}.get(found["op"], found["op"])
    if found["argument"] is None:
        return f"{op} addressed {found['lanes']} of its {found['of']} lanes outside every tensor passed to the kernel"
    side, count = ("past the end", found["past_end"]) if found["past_end"] else ("before the start",
                                                                               found["before_start"])
    return (f"{op} of {found['argument']} addressed {found['lanes']} of its {found['of']} lanes {side} of that "
            f"tensor (up to {count:,} elements, {count / d:.0f} rows of d = {d}, beyond it)")


@hidden_test("test_flash_attention_triton_bounds")
def check_triton_bounds(nb):
    # The last head's last key block runs past the end of k and v; the last query block past q and o. The
    # probe places q, k and v apart from each other, so that what runs past one never lands in the next.
    for shape, causal, seed in (((1, 2, 100, 16), False, 41), ((1, 2, 100, 16), True, 42),
                                ((1, 1, 70, 32), False, 43), ((1, 1, 70, 32), True, 44)):
        run, where = _triton_case(nb, shape, causal, seed, compare=False, spaced=True)
        bounds = run["bounds"]
        if bounds["violations"]:
            first = _describe_violation(bounds["violations"][0], shape[-1])
            raise AssertionError(
                f"{where}: {first}; {bounds['outside']:,} lanes in all went outside a tensor. On a GPU such an "
                f"access reads or writes memory that is not the tensor's (wrong values, or a crash with an illegal "
                f"address); here those lanes were switched off. {BOUNDS_HINT}")
