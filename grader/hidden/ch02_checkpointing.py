"""Hidden tests of chapter 2 (activation checkpointing), one graded cell per property.

checkpoint:
- values (test_checkpoint): an MLP with awkward sizes, with and without leading batch dimensions;
  the output and every gradient equal plain autograd's bit for bit (the recomputation runs the same
  kernels on the same inputs).
- rng: with dropout in training mode, the same comparison: the recomputation draws the same mask.
- edge cases: an input that needs no gradient (the parameters still get theirs), two inputs of
  which only the second requires grad, and a plain function (no nn.Module) called with a float.
- memory (test_checkpoint_memory): read from outside the student's process (``grader.resources``) for six
  Linear(W, W) + ReLU layers on a seeded (B, W) input drawn at grading time (W in 64..128, B * W from 2^20 to 2^21
  elements): between forward and backward the process may hold at most two inputs more than before; on that same
  call the loss, the input's gradient checksum and every parameter's gradient equal plain autograd's (the judge
  recomputes them). A BatchNorm1d in training mode inside function counts its calls in its own buffer: the
  forward call runs function once, backward once more. What the forward call saved, measured inside the
  student's process, only explains a failed reading.

checkpoint_uniform, checkpoint_blocks: the chunks are read from *which layers run again during
backward*, and in what order: each checkpointed chunk is recomputed as one run of consecutive layers,
the last chunk first (a trace that can take these points away, never award them). Values and gradients
(bit for bit), the forward calls and the chunks on the regular cases; the edge cases (an input that needs no gradient, a block size beyond the
chain, the ValueErrors) in a cell of their own. Memory in a cell of its own (test_checkpoint_uniform_memory,
test_checkpoint_blocks_memory), read from outside the process as for checkpoint: eight Linear(W, W) + ReLU layers,
the same drawn input, k or b drawn from 2 to 4; at most one input more than the chunk inputs is held between
forward and backward, with the loss and gradients of that call checked. Saved-tensor hooks and layer traces cannot
see activations kept on ctx attributes or in lists; the cgroup reading does.

plan_checkpoints: optimal plans where one fits (hand-made and random chains of up to 10 layers, against
exhaustive search); the edge cases (one layer, budgets no plan fits, lists of different lengths); a
40-layer chain, which only a dynamic program finishes within a graded cell's time.

Gradients are compared with plain autograd on a copy of the same module, run judge-side by the same
trusted probe (``probes.ch02_run_and_trace``) with ``module(x)`` as the function.
"""
from __future__ import annotations

import copy
import itertools
import random
from contextlib import contextmanager

import torch
from torch import nn

from coursekit.checks import check_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, draw, fresh_tensor, mib, new_seed, seeded
from grader.source_policy import Shortcut, SourcePolicy

# Exercise cells may not use torch.utils.checkpoint (the text says so: section 7 compares with it).
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own recomputing blocks"),
    Shortcut(paths=("torch.utils.checkpoint",),
             instead="write checkpoint with your own torch.autograd.Function; section 7 compares it with "
                     "torch.utils.checkpoint"),
))

# Recomputation runs the same kernels on the same inputs (with the same dropout mask), so the output and
# every gradient equal plain autograd's bit for bit: no tolerance.
EXACT = dict(atol=0.0, rtol=0.0)

OUTPUT_HINT = "the forward pass returns function(*args) itself, computed once from the inputs as given"
VALUES_HINT = ("in backward, run function again on detached copies of the saved inputs under torch.enable_grad() "
               "and back-propagate grad_output through that graph: the same kernels on the same inputs give plain "
               "autograd's gradients bit for bit")
RNG_OUTPUT_HINT = ("with dropout the output is function(*args) drawn from the random state as the caller left it: "
                   "call function once in the forward pass and leave the random state alone before that call")
RNG_HINT = ("with dropout the recomputed forward must draw the same mask as the first one: save "
            "torch.get_rng_state() before calling function and restore it before recomputing")
PARAM_HINT = ("when no input requires a gradient, the parameters of function still do: pass them to "
              "your autograd.Function's apply() so that the output is attached to the graph, and give "
              "them their gradients")
ATTACH_HINT = ("return what your autograd.Function's apply() returns: an output computed under torch.no_grad() "
               "or detached has no grad_fn, so backward never reaches function")
PARAM_GRAD_HINT = ("give every parameter of function that requires grad its gradient: return it from backward for "
                   "the parameters you passed to apply(), or accumulate it with torch.autograd.backward on the "
                   "recomputed output")
INPUT_GRAD_HINT = ("return one gradient per input of apply(), in the order of the inputs: the gradient of each tensor "
                   "argument that requires grad, None for the others")
EDGE_HINT = ("whichever inputs require grad, each input that does and every parameter get exactly plain autograd's "
             "gradient; the others get none")
MEMORY_HINT = ("a checkpoint keeps only its inputs: run function without recording a graph "
               "(inside autograd.Function.forward, or under torch.no_grad()) and recompute it in backward")
CHUNK_VALUES_HINT = ("run the layers in order, each exactly once per pass, each chunk through your checkpoint (whose "
                     "gradients equal plain autograd's, test_checkpoint)")
CHUNK_MEMORY_HINT = ("run every chunk as one checkpoint(...) call and keep nothing else alive until backward: no graph "
                     "kept on ctx or elsewhere, no list of layer outputs; only the chunk inputs stay")
CHUNK_ATTACH_HINT = ("each chunk's output is what checkpoint(...) returns, attached to the graph (test_checkpoint): "
                     "do not detach it, nor run the chunks under torch.no_grad()")
SPLIT_HINT = ("n layers in k chunks: the first n % k chunks have n // k + 1 layers, the others n // k "
              "(10 layers in 4 chunks: 3, 3, 2, 2)")
BLOCK_HINT = "chunks are layers [0, b), [b, 2b), ...; the last one may be shorter"
LONG_BLOCK_HINT = "a block size b >= n is valid: one chunk of all n layers, run under checkpoint"
EVERY_CHUNK_HINT = "every chunk, the last one included, runs as one checkpoint(...) call"
OPTIMUM_HINT = ("Fitting is not enough: the plan must recompute the least of all plans that fit, and locally best "
                "(greedy) or evenly spaced choices can miss it. Compare every first segment [i, j] and keep, for "
                "each start, the plans no other plan beats on both stored bytes and recomputation")
COST_HINT = ("Your plan is the best one if a segment's last layer costs nothing to recompute, but Recompute(C) "
             "charges every layer of a segment of two or more layers, its last one included (your checkpoint reruns "
             "the whole segment), and nothing for a one-layer segment (plan_recompute in the setup cell)")
FITS_HINT = ("Check your memory model (stored inputs + the largest segment's inner inputs, plan_memory in the setup "
             "cell) and that your search reaches every plan")


# --- helpers ------------------------------------------------------------------------------------
def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _plain(module, x, *extra):
    return module(x, *extra)


def _run_plain_chain(module, x, *_):
    return module(x)


@contextmanager
def _threads(n):
    """torch's intra-op thread count set to ``n`` (1 to 64) for the block, then restored. A matrix product
    split over two threads rounds differently from one on a single thread, so the reference runs on as
    many threads as the student's call did (the sandbox worker: one). Judge code runs under the judge
    lock, released only while waiting for a worker: no other check runs in between."""
    n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 64 else 1
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _reference(module, x, g, *extra, seed=0, x_requires_grad=True, fn=_plain, threads=None) -> dict:
    """Plain autograd's run of ``module``, on the thread count of the student's run (``got["threads"]``)."""
    with _threads(threads if threads is not None else torch.get_num_threads()):
        return probes.ch02_run_and_trace(fn, copy.deepcopy(module), x, g, *extra, seed=seed,
                                         x_requires_grad=x_requires_grad)


def _student(nb, fn_name: str, module, x, g, *extra, seed=0, x_requires_grad=True) -> dict:
    """The student's run on a copy of ``module`` (in-kernel, the reference must not see what it did)."""
    return fetch(nb.apply(probes.ch02_run_and_trace, nb[fn_name], copy.deepcopy(module), x, g, *extra, seed=seed,
                          x_requires_grad=x_requires_grad))


def _nbytes(t: torch.Tensor) -> int:
    return t.nelement() * t.element_size()


def _needs_grad(x_requires_grad: bool, extra) -> bool:
    """Whether an input (not only a parameter) of the call requires grad."""
    return x_requires_grad or any(isinstance(e, torch.Tensor) and e.requires_grad for e in extra)


def _compare(got: dict, ref: dict, where: str, hint: str, output_hint: str = OUTPUT_HINT,
             inputs_need_grad: bool = True, attach_hint: str = ATTACH_HINT) -> None:
    """Output and every gradient against plain autograd's, bit for bit."""
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph, so nothing can "
                             f"receive a gradient. {attach_hint if inputs_need_grad else PARAM_HINT}")
    check_close(got["y"], ref["y"], f"the output {where}", output_hint, **EXACT)
    if ref["dx"] is None and got["dx"] is not None:
        raise AssertionError(f"{where}: the input does not require grad, yet it received a gradient")
    if ref["dx"] is not None:
        if got["dx"] is None:
            raise AssertionError(f"{where}: no gradient reached the input. {INPUT_GRAD_HINT}")
        check_close(got["dx"], ref["dx"], f"the input gradient {where}", hint, **EXACT)
    for i, (a, b) in enumerate(zip(got["extra_grads"], ref["extra_grads"])):
        if b is not None:
            if a is None:
                raise AssertionError(f"{where}: no gradient reached argument {i + 2} of function. {INPUT_GRAD_HINT}")
            check_close(a, b, f"the gradient of argument {i + 2} {where}", hint, **EXACT)
    for name, b in ref["grads"].items():
        a = got["grads"].get(name)
        if b is not None and a is None:
            raise AssertionError(f"{where}: the parameter {name} received no gradient. "
                                 f"{PARAM_GRAD_HINT if inputs_need_grad else PARAM_HINT}")
        if b is not None:
            check_close(a, b, f"the gradient of parameter {name} {where}", hint, **EXACT)


# --- checkpoint -----------------------------------------------------------------------------------
def _mlp(seed: int, dropout: float | None = None) -> nn.Sequential:
    def build():
        mods = [nn.Linear(37, 53), nn.ReLU(), nn.Linear(53, 29), nn.Tanh()]
        if dropout is not None:
            mods.append(nn.Dropout(dropout))
        return nn.Sequential(*mods, nn.Linear(29, 11))
    return _seeded(seed, build)


def _values_cases() -> list[dict]:
    """Plain MLPs, the input requiring grad, awkward sizes and leading batch dimensions."""
    return [dict(module=_mlp(1), x=_randn(7, 37, seed=2), g=_randn(7, 11, seed=3),
                 where="for an MLP 37 → 53 → 29 → 11 on a batch of 7"),
            dict(module=_mlp(4), x=_randn(2, 5, 37, seed=5), g=_randn(2, 5, 11, seed=6),
                 where="for an input of shape (2, 5, 37)")]


def _rng_cases() -> list[dict]:
    """Dropout in training mode: the recomputation must replay the random state."""
    return [dict(module=_mlp(seed, dropout=0.5), x=_randn(9, 37, seed=seed + 20), g=_randn(9, 11, seed=seed + 40),
                 seed=seed, where=f"with dropout (p=0.5) in training mode (seed {seed})") for seed in (11, 12)]


def _edge_cases() -> list[dict]:
    """The input needs no gradient (a data batch), the parameters do; two inputs, only the second requiring grad."""
    bil = _seeded(13, lambda: nn.Bilinear(13, 17, 5))
    return [dict(module=_mlp(7), x=_randn(6, 37, seed=8), g=_randn(6, 11, seed=9), x_requires_grad=False,
                 where="when the input does not require grad"),
            dict(module=bil, x=_randn(4, 13, seed=15), g=_randn(4, 5, seed=16),
                 extra=(_randn(4, 17, seed=14).requires_grad_(True),), x_requires_grad=False,
                 where="for nn.Bilinear with two inputs (checkpoint(bilinear, x1, x2), only x2 requiring grad)")]


def _run_case(nb, case: dict) -> tuple[dict, dict]:
    """(student's run, plain autograd's run) of one case."""
    extra, seed, req = case.get("extra", ()), case.get("seed", 0), case.get("x_requires_grad", True)
    got = _student(nb, "checkpoint", case["module"], case["x"], case["g"], *extra, seed=seed, x_requires_grad=req)
    ref = _reference(case["module"], case["x"], case["g"], *extra, seed=seed, x_requires_grad=req,
                     threads=got.get("threads"))
    return got, ref


@hidden_test("test_checkpoint")
def check_checkpoint(nb):
    for case in _values_cases():
        got, ref = _run_case(nb, case)
        _compare(got, ref, case["where"], VALUES_HINT)


@hidden_test("test_checkpoint_rng", requires=("test_checkpoint_memory",))
def check_checkpoint_rng(nb):
    for case in _rng_cases():
        got, ref = _run_case(nb, case)
        _compare(got, ref, case["where"], RNG_HINT, output_hint=RNG_OUTPUT_HINT)


CALLABLE_HINT = "function may be any callable and args may hold plain values, with or without tensors beside them"
MODULE_ONLY_HINT = ("function may be any callable: only an nn.Module has parameters() (a plain function has none to "
                    "pass on); ask for them only when isinstance(function, nn.Module)")
PLAIN_VALUE_HINT = ("args may hold plain values, which save_for_backward does not take: keep those on ctx, save only "
                    "the tensors, and hand the values back unchanged to the recomputation (they get no gradient)")


def _callable_hint(error: str) -> str:
    """The hint for what the error shows: a plain function asked for parameters, or a float saved as a tensor."""
    if error.startswith("AttributeError") and "parameters" in error:
        return MODULE_ONLY_HINT
    if "save_for_backward" in error:
        return PLAIN_VALUE_HINT
    return CALLABLE_HINT


def _check_plain_callable(nb) -> None:
    """A function that is no nn.Module, called with a tensor and a plain float (the probe's tanh(x) * s + x)."""
    scale = 2.5
    x, g = _randn(5, 7, seed=17), _randn(5, 7, seed=18)
    where = (f"for checkpoint(function, x, {scale}) with a plain function (no nn.Module, no parameters: "
             f"tanh(x) * scale + x) and a float argument")
    got = fetch(nb.apply(probes.ch02_run_callable, nb.checkpoint, x, scale, g))
    if "error" in got:
        raise AssertionError(f"{where}: it raised {got['error']}. {_callable_hint(got['error'])}")
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph although x requires grad. "
                             f"{ATTACH_HINT}")
    xr = x.clone().requires_grad_(True)
    yr = torch.tanh(xr) * scale + xr
    yr.backward(g)
    check_close(got["y"], yr.detach(), f"the output {where}", CALLABLE_HINT, **EXACT)
    if got["dx"] is None:
        raise AssertionError(f"{where}: no gradient reached x. {INPUT_GRAD_HINT}")
    check_close(got["dx"], xr.grad, f"the gradient of x {where}", CALLABLE_HINT, **EXACT)


@hidden_test("test_checkpoint_edge_cases", requires=("test_checkpoint_memory",))
def check_checkpoint_edge_cases(nb):
    for case in _edge_cases():
        got, ref = _run_case(nb, case)
        _compare(got, ref, case["where"], EDGE_HINT,
                 inputs_need_grad=_needs_grad(case.get("x_requires_grad", True), case.get("extra", ())))
    _check_plain_callable(nb)


def _schedule_explanation(nb) -> str:
    """What the forward call saved, measured inside the student's process on the first values case: read
    only after the outside reading has decided, to explain its failure (never a reason on its own)."""
    case = _values_cases()[0]
    try:
        got = _student(nb, "checkpoint", case["module"], case["x"], case["g"])
    except Exception:  # noqa: BLE001 - an explanation is optional; the reading above decided
        return ""
    bound = _nbytes(case["x"])
    if got["activation_bytes"] > bound:
        return (f" Inside your process, the forward call {case['where']} saved {got['activation_bytes']:,} bytes for "
                f"backward, where a checkpoint saves only its input ({bound:,} bytes).")
    return (" Saved-tensor hooks inside your process saw no more than the input saved: memory kept elsewhere "
            "(ctx attributes, globals, module attributes, lists) is not saved for backward, so it does not show "
            "there, but your process still holds it.")


@hidden_test("test_checkpoint_memory")
def check_checkpoint_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    depth, batch, width = CHECKPOINT_DEPTH, *_draw_input_shape()
    where = (f"checkpoint(mlp, x) for {depth} Linear({width}, {width}) + ReLU layers on a ({batch}, {width}) "
             "input")
    _check_memory_case(nb, meter, where, lambda module, x: nb.checkpoint(module, x), depth, batch, width,
                       kept_inputs=1, kept_what="its input", hint=MEMORY_HINT,
                       explain=lambda: _schedule_explanation(nb))
    _check_call_counts(nb)


def _check_call_counts(nb) -> None:
    """How many times function ran, read from what it did: a BatchNorm1d in training mode counts its calls in
    its own buffer (num_batches_tracked), a value of the judge's module fetched between the calls."""
    module = _seeded(17, lambda: nn.Sequential(nn.Linear(37, 53), nn.BatchNorm1d(53), nn.ReLU(), nn.Linear(53, 11)))
    x, g = _randn(8, 37, seed=18).requires_grad_(True), _randn(8, 11, seed=19)
    sent = nb.put((module, module[1].num_batches_tracked, x, g))
    where = "for an MLP with a BatchNorm1d in training mode (it counts its calls in num_batches_tracked)"
    y = nb.checkpoint(sent[0], sent[2])
    forward = int(fetch(sent[1]))
    if forward != 1:
        raise AssertionError(f"{where}, the forward call ran function {forward} times: run it exactly once in the "
                             "forward pass (its FLOPs are those of plain function(*args))")
    if not fetch(y.requires_grad):
        raise AssertionError(f"{where}: the output is not attached to the autograd graph, so backward never ran "
                             f"function again. {ATTACH_HINT}")
    y.backward(sent[3])
    del y
    again = int(fetch(sent[1])) - 1
    if again != 1:
        raise AssertionError(f"{where}, backward ran function {again} times: recompute function(*args) once in "
                             "backward, whole")


# --- memory, read from outside the student's process -------------------------------------------------
# Sizes drawn at grading time from the ranges the docstrings state: a float32 (B, W) input, W in 64..128 (a
# multiple of 32), B * W from 2^20 to 2^21 elements (4 to 8 MiB), through layers Linear(W, W) + ReLU. Keeping every
# layer input holds depth + 1 inputs; a checkpoint holds its input, a chunked run its chunk inputs (c <= 4 of them).
# The bound allows one input more (4 MiB or more above what a right answer holds; measured: 0.2-0.5 MiB of noise), and
# lies at least 4 inputs (16 MiB) below what keeping every layer input holds (9 inputs for 8 layers and c <= 4 chunks,
# 7 for the checkpoint's 6 layers against its bound of 2), far more than the FOOTPRINT + GROWTH (5 MiB) that ballast
# freed during the measured call can hide.
MEMORY_WIDTHS = (64, 128, 32)
MEMORY_ELEMENTS = (2**20, 2**21)
CHECKPOINT_DEPTH = 6
CHAIN_DEPTH = 8
UNIFORM_SEGMENTS = (2, 4)
BLOCK_SIZES = (2, 4)


def _draw_input_shape() -> tuple[int, int]:
    width = draw(*MEMORY_WIDTHS)
    low, high = MEMORY_ELEMENTS
    return draw(-(-low // width), high // width, 8), width


def _relu_layers(depth: int, width: int, seed: int) -> nn.Sequential:
    """``depth`` layers, each an nn.Sequential(Linear(width, width), ReLU()), as ``mlp_layers`` builds them."""
    return _seeded(seed, lambda: nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                                                for _ in range(depth)]))


def _plain_values(module: nn.Module, shape, seed: int) -> dict:
    """Plain autograd's loss, input-gradient checksum and parameter gradients on the seeded input, with the
    scales the tolerances follow (sums of absolute values: float32 sums in another order round differently)."""
    x = seeded(shape, seed=seed).requires_grad_(True)
    y = module(x)
    loss = y.sum()
    loss.backward()
    return {"loss": loss.detach(), "loss_scale": float(y.detach().abs().sum()),
            "dx_sum": x.grad.sum(), "dx_scale": float(x.grad.abs().sum()),
            "grads": [p.grad.detach().clone() for p in module.parameters()]}


def _check_memory_case(nb, meter: Meter, where: str, run, depth: int, batch: int, width: int, kept_inputs: int,
                       kept_what: str, hint: str, explain) -> None:
    """``run(module, x)`` on ``depth`` layers and a seeded (batch, width) input, between two outside readings:
    what the process holds between forward and backward (with x and the output released) may be at most
    ``kept_inputs`` + 1 inputs; on the same call the loss and every gradient equal plain autograd's."""
    model = _relu_layers(depth, width, new_seed())
    reference_model = copy.deepcopy(model)  # in-kernel the student's call shares ``model``
    seed = new_seed()
    sent = meter.put((model, list(model.parameters())))
    module, params = sent[0], sent[1]
    run(module, fresh_tensor(nb, (2, width))).sum()  # a first call (no backward: no gradients yet)
    held, loss = meter.held_by(lambda x: run(module, x).sum(),
                               inputs=lambda: [meter.tensor((batch, width), seed=seed)])
    x_bytes = batch * width * 4
    if held.kept > (kept_inputs + 1) * x_bytes:
        raise AssertionError(
            f"{where}: between forward and backward, with x and the output released, your process still held "
            f"{mib(held.kept)} more than before (read from outside your process), more than the "
            f"{mib((kept_inputs + 1) * x_bytes)} allowed: {kept_what} ({mib(kept_inputs * x_bytes)}) and one input's "
            f"worth of slack ({mib(x_bytes)}); keeping every layer's input holds about "
            f"{mib((depth + 1) * x_bytes)}. {hint}.{explain()}")
    _check_call_values(nb, where, loss, held.leaves[0], params, _plain_values(reference_model, (batch, width), seed))


def _check_call_values(nb, where: str, loss, leaf, params, ref: dict) -> None:
    """The measured call's loss, input-gradient checksum and parameter gradients against plain autograd's."""
    hint = ("the measured call must compute what plain autograd computes, on every input size: the loss is the sum "
            "of the output, and backward gives the input and every parameter their gradients")
    got_loss = fetch(loss)
    check_close(got_loss, ref["loss"], f"the loss {where}", hint, atol=1e-5 * ref["loss_scale"], rtol=0.0)
    try:
        loss.backward()
    except Exception as e:  # noqa: BLE001 - the student's backward raised
        raised = getattr(e, "type_name", type(e).__name__)
        raise AssertionError(f"{where}: backward through the output raised {raised}. {ATTACH_HINT}") from None
    dx_sum = fetch(leaf.grad)
    if dx_sum is None:
        raise AssertionError(f"{where}: no gradient reached the input. {INPUT_GRAD_HINT}")
    check_close(dx_sum, ref["dx_sum"], f"the sum of the input's gradient {where}", hint,
                atol=1e-5 * ref["dx_scale"], rtol=0.0)
    states = fetch(nb.apply(probes.tensor_states, params))
    for i, (state, expected) in enumerate(zip(states, ref["grads"])):
        if state["grad"] is None:
            raise AssertionError(f"{where}: parameter {i} of the layers received no gradient. {PARAM_GRAD_HINT}")
        check_close(state["grad"], expected, f"the gradient of parameter {i} {where}", hint,
                    atol=1e-5 * float(expected.abs().max()), rtol=1e-4)


# --- uniform and block methods ------------------------------------------------------------------
def _chain(seed: int) -> nn.Sequential:
    """Ten layers of distinct widths, ReLU/Tanh among them (chunks with and without parameters)."""
    return _seeded(seed, lambda: nn.Sequential(
        nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 11), nn.Tanh(), nn.Linear(11, 13), nn.Linear(13, 17),
        nn.ReLU(), nn.Linear(17, 19), nn.Linear(19, 23), nn.Linear(23, 3)))


def _recomputed_chunks(calls: list[str]) -> list[tuple[int, int]]:
    """Runs of consecutive layer indices in the backward calls, in forward order, as (first, last)."""
    runs: list[list[int]] = []
    for i in (int(c) for c in calls):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return [(r[0], r[-1]) for r in reversed(runs)]


def _fmt(chunks) -> str:
    return ", ".join(f"[{a}–{b}]" if a != b else f"[{a}]" for a, b in chunks) or "none"


def _chunk_hint(found: list[tuple[int, int]], chunks: list[tuple[int, int]], split_hint: str) -> str:
    """Name the mistake the recomputed chunks show: nothing recomputed, chunks missing, or other boundaries."""
    if not found:
        return f"Nothing ran again during backward: {EVERY_CHUNK_HINT}"
    missing = [c for c in chunks if c not in found]
    if len(found) > len(chunks) and all(a == b for a, b in found):
        return (f"The layers were recomputed one at a time, each as a chunk of its own. {split_hint}; each chunk "
                "runs as one checkpoint(...) call")
    if set(found) <= set(chunks):
        return f"The chunks {_fmt(missing)} were not recomputed: {EVERY_CHUNK_HINT}"
    return split_hint


def _check_chunked(nb, fn_name: str, arg: int, chunks: list[tuple[int, int]], split_hint: str, seed: int,
                   x_requires_grad: bool = True, values: bool = True, layout: bool = True,
                   raised_hint: str = "") -> None:
    """``values``: output and gradients bit for bit; ``layout``: forward calls and recomputed chunks
    (on an attached output only when ``values`` is off: then another cell grades attaching). ``raised_hint``
    explains an exception the call should not raise."""
    chain = _chain(seed)
    x, g = _randn(6, 5, seed=seed + 1), _randn(6, 3, seed=seed + 2)
    where = f"{fn_name}(10 layers, x, {arg})" + ("" if x_requires_grad else " with an x that needs no gradient")
    try:
        got = _student(nb, fn_name, chain, x, g, arg, seed=seed, x_requires_grad=x_requires_grad)
    except NameError:
        raise
    except Exception as e:  # noqa: BLE001 - the student's function raised
        if not raised_hint:
            raise
        raised = getattr(e, "type_name", type(e).__name__)
        detail = getattr(e, "message", None) if hasattr(e, "type_name") else str(e)
        raise AssertionError(f"{where} raised {raised}" + (f" ({detail})" if detail else "")
                             + f": {raised_hint}") from None
    ref = _reference(chain, x, g, arg, seed=seed, x_requires_grad=x_requires_grad, fn=_run_plain_chain,
                     threads=got.get("threads"))
    if values:
        _compare(got, ref, f"for {where}", CHUNK_VALUES_HINT, output_hint=CHUNK_VALUES_HINT,
                 inputs_need_grad=x_requires_grad, attach_hint=CHUNK_ATTACH_HINT)
    if not layout or not got["attached"]:
        return
    if got["forward_calls"] != ref["forward_calls"]:
        raise AssertionError(f"for {where} the forward pass called the layers {got['forward_calls']}, expected "
                             f"each once, in order")
    found = _recomputed_chunks(got["backward_calls"])
    # A checkpoint may skip recomputing a chunk's last layer (its output is not needed for backward).
    full = [str(i) for a, b in reversed(chunks) for i in range(a, b + 1)]
    short = [str(i) for a, b in reversed(chunks) for i in range(a, b)]
    if got["backward_calls"] not in (full, short):
        raise AssertionError(f"for {where} the chunks recomputed during backward were {_fmt(found)}, expected "
                             f"{_fmt(chunks)}. {_chunk_hint(found, chunks, split_hint)}")
    # What the forward pass keeps is graded from outside the process (test_checkpoint_*_memory), not here.


def _expect_value_error(nb, fn_name: str, arg, what: str) -> None:
    chain = _chain(0)
    names = fetch(nb.apply(probes.raised, nb[fn_name], chain, _randn(2, 5, seed=0), arg))
    if names is None or "ValueError" not in names:
        got = "returned a result" if names is None else f"raised {names[0]}"
        raise AssertionError(f"{fn_name}(10 layers, x, {arg!r}) {got}: {what} raises ValueError")


UNIFORM_CASES = [(4, [(0, 2), (3, 5), (6, 7), (8, 9)]), (3, [(0, 3), (4, 6), (7, 9)]),
                 (6, [(0, 1), (2, 3), (4, 5), (6, 7), (8, 8), (9, 9)]), (1, [(0, 9)]),
                 (10, [(i, i) for i in range(10)])]
BLOCK_CASES = [(3, [(0, 2), (3, 5), (6, 8), (9, 9)]), (4, [(0, 3), (4, 7), (8, 9)]), (1, [(i, i) for i in range(10)]),
               (10, [(0, 9)]), (6, [(0, 5), (6, 9)])]


@hidden_test("test_checkpoint_uniform")
def check_checkpoint_uniform(nb):
    for i, (k, chunks) in enumerate(UNIFORM_CASES):
        _check_chunked(nb, "checkpoint_uniform", k, chunks, SPLIT_HINT, seed=30 + i)
    # The chunks with an input that needs no gradient (its values: test_checkpoint_uniform_edge_cases).
    _check_chunked(nb, "checkpoint_uniform", 3, UNIFORM_CASES[1][1], SPLIT_HINT, seed=40, x_requires_grad=False,
                   values=False)


def _chunk_explanation(nb, fn_name: str, arg: int, chunks: list[tuple[int, int]]) -> str:
    """What the forward pass saved on the 10-layer chain, measured inside the student's process: read only after
    the outside reading has decided, to explain its failure (never a reason on its own)."""
    chain = _chain(70)
    try:
        got = _student(nb, fn_name, chain, _randn(6, 5, seed=71), _randn(6, 3, seed=72), arg)
    except Exception:  # noqa: BLE001 - an explanation is optional; the reading above decided
        return ""
    widths = [5, 7, 7, 11, 11, 13, 17, 17, 19, 23]
    bound = sum(6 * widths[a] * 4 for a, _ in chunks)
    if got["activation_bytes"] > bound:
        return (f" Inside your process, {fn_name}(10 layers, x, {arg}) saved {got['activation_bytes']:,} bytes for "
                f"backward, more than the inputs of its chunks {_fmt(chunks)} ({bound:,} bytes).")
    return (" Saved-tensor hooks inside your process saw no more than the chunk inputs saved: memory kept elsewhere "
            "(ctx attributes, globals, module attributes, lists filled by hooks) is not saved for backward, so it "
            "does not show there, but your process still holds it.")


def _check_chunked_memory(nb, fn_name: str, arg: int, chunks: int, explain_arg: int,
                          explain_chunks: list[tuple[int, int]]) -> None:
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    depth, (batch, width) = CHAIN_DEPTH, _draw_input_shape()
    fn = nb[fn_name]
    where = (f"{fn_name}(layers, x, {arg}) for {depth} layers Linear({width}, {width}) + ReLU on a ({batch}, {width}) "
             "input")
    _check_memory_case(nb, meter, where, lambda module, x: fn(module, x, arg), depth, batch, width,
                       kept_inputs=chunks, kept_what=f"the inputs of its {chunks} chunks", hint=CHUNK_MEMORY_HINT,
                       explain=lambda: _chunk_explanation(nb, fn_name, explain_arg, explain_chunks))


@hidden_test("test_checkpoint_uniform_memory")
def check_checkpoint_uniform_memory(nb):
    segments = draw(*UNIFORM_SEGMENTS)
    _check_chunked_memory(nb, "checkpoint_uniform", segments, segments, *UNIFORM_CASES[0])


@hidden_test("test_checkpoint_uniform_edge_cases")
def check_checkpoint_uniform_edge_cases(nb):
    _check_chunked(nb, "checkpoint_uniform", 3, UNIFORM_CASES[1][1], SPLIT_HINT, seed=40, x_requires_grad=False,
                   layout=False)
    for bad in (0, 11, -1):
        _expect_value_error(nb, "checkpoint_uniform", bad, "a number of segments outside 1..n")
    _expect_value_error(nb, "checkpoint_uniform", 2.5, "a number of segments that is not an int")


@hidden_test("test_checkpoint_blocks")
def check_checkpoint_blocks(nb):
    for i, (b, chunks) in enumerate(BLOCK_CASES):
        _check_chunked(nb, "checkpoint_blocks", b, chunks, BLOCK_HINT, seed=50 + i)
    _check_chunked(nb, "checkpoint_blocks", 4, BLOCK_CASES[1][1], BLOCK_HINT, seed=60, x_requires_grad=False,
                   values=False)


@hidden_test("test_checkpoint_blocks_memory")
def check_checkpoint_blocks_memory(nb):
    block_size = draw(*BLOCK_SIZES)
    _check_chunked_memory(nb, "checkpoint_blocks", block_size, -(-CHAIN_DEPTH // block_size), *BLOCK_CASES[1])


@hidden_test("test_checkpoint_blocks_edge_cases")
def check_checkpoint_blocks_edge_cases(nb):
    # A block longer than the chain: one chunk (b >= n is a valid block size).
    _check_chunked(nb, "checkpoint_blocks", 15, [(0, 9)], LONG_BLOCK_HINT, seed=54, raised_hint=LONG_BLOCK_HINT)
    _check_chunked(nb, "checkpoint_blocks", 4, BLOCK_CASES[1][1], BLOCK_HINT, seed=60, x_requires_grad=False,
                   layout=False)
    for bad in (0, -2):
        _expect_value_error(nb, "checkpoint_blocks", bad, "a block size below 1")
    _expect_value_error(nb, "checkpoint_blocks", 2.5, "a block size that is not an int")


# --- the planner -----------------------------------------------------------------------------------
def _memory(plan, act) -> int:
    starts = list(plan) + [len(act)]
    return sum(act[c] for c in plan) + max(sum(act[a + 1:b]) for a, b in zip(starts[:-1], starts[1:]))


def _recompute(plan, fwd) -> int:
    """As ``checkpoint`` does it: a segment of two or more layers reruns whole; a one-layer segment runs plainly."""
    starts = list(plan) + [len(fwd)]
    return sum(sum(fwd[a:b]) for a, b in zip(starts[:-1], starts[1:]) if b - a > 1)


def _recompute_last_free(plan, fwd) -> int:
    """Another cost model (torch's non-reentrant early stop): a segment's last layer is never recomputed."""
    starts = list(plan) + [len(fwd)]
    return sum(sum(fwd[a:b - 1]) for a, b in zip(starts[:-1], starts[1:]))


def _brute_force(act, fwd, budget, cost=_recompute):
    best = None
    for r in range(len(act)):
        for rest in itertools.combinations(range(1, len(act)), r):
            plan = (0, *rest)
            if _memory(plan, act) <= budget:
                c = cost(plan, fwd)
                best = c if best is None or c < best else best
    return best


def _pareto_optimum(act, fwd, budget):
    """Least recompute within budget, for long chains: for each peak, Pareto fronts of (stored, recompute)."""
    n = len(act)
    best = None
    peaks = sorted({sum(act[i + 1:j + 1]) for i in range(n) for j in range(i, n)})
    for peak in peaks:
        room = budget - peak
        if room < 0:
            break
        fronts: list[dict[int, int]] = [dict() for _ in range(n)] + [{0: 0}]
        for i in reversed(range(n)):
            inner = 0
            for j in range(i, n):
                if j > i:
                    inner += act[j]
                if inner > peak:
                    break
                for stored, cost in fronts[j + 1].items():
                    s, c = stored + act[i], cost + (sum(fwd[i:j + 1]) if j > i else 0)
                    if s <= room and c < fronts[i].get(s, float("inf")):
                        fronts[i][s] = c
            pruned, low = {}, float("inf")
            for s in sorted(fronts[i]):
                if fronts[i][s] < low:
                    pruned[s], low = fronts[i][s], fronts[i][s]
            fronts[i] = pruned
        if fronts[0]:
            cost = min(fronts[0].values())
            best = cost if best is None or cost < best else best
    return best


def _least_memory(act) -> int | None:
    """The least memory any plan needs (small chains only)."""
    if len(act) > 12:
        return None
    return min(_memory((0, *r), act) for k in range(len(act)) for r in itertools.combinations(range(1, len(act)), k))


def _check_plan(nb, act, fwd, budget, optimum, label: str = "") -> None:
    where = f"plan_checkpoints({act}, {fwd}, {budget})" if len(act) <= 12 else f"plan_checkpoints for {label}"
    if optimum is None:
        names = fetch(nb.apply(probes.raised, nb.plan_checkpoints, act, fwd, budget))
        if names is None or "ValueError" not in names:
            least = _least_memory(act)
            got = "returned a plan" if names is None else f"raised {names[0]}"
            raise AssertionError(f"{where} {got}, but no plan fits in {budget} bytes"
                                 + (f" (the least memory any plan needs is {least})" if least is not None else "")
                                 + ": raise ValueError")
        return
    try:
        plan = fetch(nb.plan_checkpoints(act, fwd, budget))
    except NameError:
        raise
    except Exception as e:  # noqa: BLE001 - the student's function raised although a plan fits
        raised = getattr(e, "type_name", type(e).__name__)
        detail = getattr(e, "message", None) if hasattr(e, "type_name") else str(e)
        raised += f" ({detail})" if detail else ""
        hint = FITS_HINT if "ValueError" in raised else ""
        raise AssertionError(f"{where} raised {raised}, but plans fit in the budget (the best recomputes "
                             f"{optimum}). {hint}".strip()) from None
    if not isinstance(plan, (list, tuple)) or not all(isinstance(c, int) and not isinstance(c, bool) for c in plan):
        raise AssertionError(f"{where} returned {plan!r}: a plan is a list of layer indices (Python ints)")
    plan = list(plan)
    if not plan or plan[0] != 0 or plan != sorted(set(plan)) or plan[-1] >= len(act):
        raise AssertionError(f"{where} returned {plan}: a plan is a sorted list of distinct layer indices in "
                             f"0..{len(act) - 1} that starts with 0 (layer 0's input is always stored)")
    memory = _memory(plan, act)
    if memory > budget:
        raise AssertionError(f"{where} returned {plan}, which needs {memory} bytes: more than the budget of "
                             f"{budget}. Memory = stored inputs + the largest segment's inner inputs (plan_memory)")
    cost = _recompute(plan, fwd)
    if cost != optimum:
        # On a short chain, say so when the plan is the best one under the cost that skips each segment's last layer.
        other = len(act) <= 12 and _recompute_last_free(plan, fwd) == _brute_force(act, fwd, budget,
                                                                                   cost=_recompute_last_free)
        raise AssertionError(
            f"{where} returned {plan}, which fits ({memory} bytes) but recomputes {cost}; the best plan within the "
            f"budget recomputes {optimum}. {COST_HINT if other else OPTIMUM_HINT}")


HAND_MADE = ([9, 1, 1, 1, 9, 1, 1, 1, 1, 5], [1, 6, 1, 1, 1, 7, 1, 1, 1, 1])  # big early inputs, cheap late ones


def _random_chains() -> list[tuple[list[int], list[int], int, int | None]]:
    """30 random chains of 2 to 10 layers, budgets spread between infeasible and roomy, with their optimum."""
    rng = random.Random(2016)
    chains = []
    for _ in range(30):
        n = rng.randint(2, 10)
        act = [rng.randint(1, 40) for _ in range(n)]
        fwd = [rng.randint(0, 25) for _ in range(n)]
        budget = rng.randint(max(act) - 5, sum(act) + 3)
        chains.append((act, fwd, budget, _brute_force(act, fwd, budget)))
    return chains


@hidden_test("test_plan_checkpoints")
def check_plan_checkpoints(nb):
    # Hand-made: big early inputs and cheap late ones, where evenly spaced or greedy plans lose.
    act, fwd = HAND_MADE
    for budget in (20, 21, 22, 23, 24, 27, sum(act)):
        _check_plan(nb, act, fwd, budget, _brute_force(act, fwd, budget))
    # Random chains where a plan fits (the others: test_plan_checkpoints_edge_cases).
    for act, fwd, budget, optimum in _random_chains():
        if optimum is not None:
            _check_plan(nb, act, fwd, budget, optimum)


@hidden_test("test_plan_checkpoints_edge_cases")
def check_plan_checkpoints_edge_cases(nb):
    # One layer: its input is the whole plan, or nothing fits.
    _check_plan(nb, [7], [3], 7, 0)
    _check_plan(nb, [7], [3], 6, None)
    # Budgets below the least memory any plan needs.
    _check_plan(nb, *HAND_MADE, 19, None)
    for act, fwd, budget, optimum in _random_chains():
        if optimum is None:
            _check_plan(nb, act, fwd, budget, None)
    # Lists of different lengths, with a budget every input would fit in.
    for act, fwd in (([4, 2, 3], [1, 1]), ([4, 2], [1, 1, 1])):
        names = fetch(nb.apply(probes.raised, nb.plan_checkpoints, act, fwd, 100))
        if names is None or "ValueError" not in names:
            got = "returned a plan" if names is None else f"raised {names[0]}"
            raise AssertionError(f"plan_checkpoints({act}, {fwd}, 100) {got}: act_bytes and fwd_flops give one "
                                 "number per layer, so lists of different lengths raise ValueError")


@hidden_test("test_plan_checkpoints_long_chain")
def check_plan_checkpoints_long_chain(nb):
    # A long chain (2^39 plans): only a dynamic program finishes within a graded cell's time.
    rng = random.Random(40)
    act = [rng.choice((4, 8, 12)) for _ in range(40)]
    fwd = [rng.choice((1, 2, 3)) for _ in range(40)]
    for budget in (90, 140):
        _check_plan(nb, act, fwd, budget, _pareto_optimum(act, fwd, budget),
                    f"a 40-layer chain with a budget of {budget}")
