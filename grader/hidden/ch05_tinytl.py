"""Hidden tests of chapter 5 (TinyTL), one graded cell per property.

LiteResidual:
- values (test_LiteResidual): output shapes (strides 1 and 2, odd sizes, pooling 1/2/4/8), exact zeros at
  init in both modes, a gradient reaching the zero-initialised γ, then, after giving every norm parameter
  random values, outputs and gradients against a float64 reference rebuilt here from the fetched
  parameters, in the layer order, norm (training-mode BatchNorm) and upsampling (bilinear) that the
  docstring specifies: a grader that holds the student to a written specification, rather than to
  properties any variant would pass, is the fairer one when the specification is in the exercise (and it
  is the only way to notice a skipped pooling or a nearest-neighbour upsampling).
- memory: no tensor at the input's full resolution is kept, read from outside the student's process
  (``grader.resources``) on a large input whose batch is drawn at grading time, with random parameters; the
  same call's loss, output sample and input-gradient sum are compared with the reference. Only a failure runs
  the saved-bytes probe on a small input, to say more in its message.
- edge cases: the ValueError of every condition under "Raises", and the smallest valid arguments accepted.

apply_tinytl:
- structure (test_apply_tinytl): outputs unchanged at init (eval and train mode), the trainable set exactly
  the original biases + the lite residuals + the classifier, one LiteResidual per block fed with the
  block's input, the groups rule and default kernel in the number of new parameters.
- memory: the main branch keeps no fp32 ReLU output, read from outside the student's process on a batch drawn
  at grading time, with the course's stand-in (``probes.ch05_NoBranch``: exact zeros, nothing kept) in place of
  every LiteResidual, so nothing measured of a student object is subtracted; the same call's output and
  input-gradient sum are compared with the pretrained model's. Only a failure runs the saved-split probe.
- trains: a few Adam steps lower the loss and move every trainable parameter.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from coursekit.checks import check_close, same_values
from coursekit.transfer import digits_tasks, load_pretrained_cnn
from grader import probes
from grader.api import fetch, hidden_test
from grader.probes.ch05_tinytl import CH05_REPLACED
from grader.resources import MiB, Meter, draw, fresh_tensor, mib, new_seed, seeded

TOL = dict(atol=2e-4, rtol=2e-4)  # float32 student against a float64 reference, BatchNorm divides by std
SPEC_HINT = ("build the branch in the docstring's order: avg_pool_lean(x, downsample) → conv (k×k, groups, "
             "padding k // 2, no bias) → BatchNorm2d → ReLU → 1×1 conv (no bias) → BatchNorm2d → bilinear "
             "upsampling (align_corners=False) to (ceil(H / stride), ceil(W / stride))")
ZERO_HINT = ("the final BatchNorm's weight γ (and its bias) start at 0, so the branch adds exactly nothing "
             "until training moves γ")


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- LiteResidual -----------------------------------------------------------------------------------
def _bn_train(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = h.mean(dim=(0, 2, 3), keepdim=True)
    var = ((h - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)  # biased, as BatchNorm normalises
    return (h - mean) / torch.sqrt(var + eps) * weight[:, None, None] + bias[:, None, None]


def _pool(x: torch.Tensor, d: int) -> torch.Tensor:
    """Mean over each d×d window clipped to the input (loops: the naive definition)."""
    B, C, H, W = x.shape
    out = torch.empty(B, C, math.ceil(H / d), math.ceil(W / d), dtype=x.dtype)
    rows = []
    for i in range(out.shape[2]):
        cols = [x[:, :, i * d:(i + 1) * d, j * d:(j + 1) * d].mean(dim=(2, 3)) for j in range(out.shape[3])]
        rows.append(torch.stack(cols, dim=-1))
    return torch.stack(rows, dim=-2)


def _reference(x, p, stride, d, groups, k):
    h = _pool(x, d)
    h = F.conv2d(h, p["conv"], padding=k // 2, groups=groups)
    h = torch.relu(_bn_train(h, p["norm_w"], p["norm_b"]))
    h = _bn_train(F.conv2d(h, p["pointwise"]), p["final_w"], p["final_b"])
    size = (math.ceil(x.shape[2] / stride), math.ceil(x.shape[3] / stride))
    return F.interpolate(h, size=size, mode="bilinear", align_corners=False)


ROLES = ("conv", "norm_w", "norm_b", "pointwise", "final_w", "final_b")


def _roles(params: list[dict], cin: int, cout: int, groups: int, k: int) -> dict[str, str]:
    expected = [[cout, cin // groups, k, k], [cout], [cout], [cout, cout, 1, 1], [cout], [cout]]
    shapes = [p["shape"] for p in params]
    if shapes != expected:
        raise AssertionError(
            f"LiteResidual({cin}, {cout}, groups={groups}, kernel_size={k}) has parameters of shapes {shapes}, "
            f"expected {expected} (conv weight, norm weight and bias, pointwise weight, final norm weight and "
            "bias, registered in this order; the convolutions have no bias)")
    return {role: p["name"] for role, p in zip(ROLES, params)}


def _lite(nb, cin, cout, stride, d, groups, k):
    return nb.LiteResidual(cin, cout, stride, d, groups, k)


def _check_shape_and_zero(nb, cin, cout, stride, d, groups, k, H, W, seed):
    where = f"LiteResidual({cin}, {cout}, stride={stride}, downsample={d}, groups={groups}, kernel_size={k}) " \
            f"on a (3, {cin}, {H}, {W}) input"
    x = _randn(3, cin, H, W, seed=seed)
    expected = (3, cout, math.ceil(H / stride), math.ceil(W / stride))
    lite = _lite(nb, cin, cout, stride, d, groups, k)
    shape = tuple(fetch(lite(x)).shape)
    if shape != expected:
        raise AssertionError(f"{where} returned shape {shape}, expected {expected}: the branch ends at "
                             "the block's output size, (ceil(H / stride), ceil(W / stride)), whatever the pooling")
    got = fetch(nb.apply(probes.ch05_lite_run, lite, x, torch.ones(expected)))
    for mode in ("y", "y_eval"):
        if not same_values(got[mode], torch.zeros(expected)):
            raise AssertionError(f"{where}: at init the output is not exactly zero in "
                                 f"{'train' if mode == 'y' else 'eval'} mode (max |y| = "
                                 f"{got[mode].abs().max().item():.3g}). {ZERO_HINT}")
    roles = _roles(got["params"], cin, cout, groups, k)
    gamma = got["grads"].get(roles["final_w"])
    if gamma is None or not gamma.abs().sum() > 0:
        raise AssertionError(f"{where}: the final norm's weight γ received no gradient at init; it must be a "
                             "trainable parameter that multiplies the normalised 1×1 output")
    return roles, got


def _check_reference(nb, cin, cout, stride, d, groups, k, H, W, seed, built_with=None):
    """``built_with``: construct with that downsample and set ``.downsample = d`` afterwards (section 7 does)."""
    roles, _ = _check_shape_and_zero(nb, cin, cout, stride, d, groups, k, H, W, seed)
    lite = _lite(nb, cin, cout, stride, d if built_with is None else built_with, groups, k)
    if built_with is not None:
        nb.apply(probes.ch05_set_downsample, lite, d)
    x = _randn(4, cin, H, W, seed=seed + 1)
    g = _randn(4, cout, math.ceil(H / stride), math.ceil(W / stride), seed=seed + 2)
    first = fetch(nb.apply(probes.ch05_lite_run, lite, x, g))
    values = {roles[r]: _randn(cout, seed=seed + 3 + i) for i, r in enumerate(("norm_w", "norm_b", "final_w", "final_b"))}
    got = fetch(nb.apply(probes.ch05_lite_run, lite, x, g, values))
    p = {role: (values[name] if name in values else next(q["value"] for q in first["params"] if q["name"] == name))
         .double().requires_grad_(True) for role, name in roles.items()}
    xr = x.double().requires_grad_(True)
    y = _reference(xr, p, stride, d, groups, k)
    y.backward(g.double())
    where = f"for LiteResidual({cin}, {cout}, stride={stride}, downsample={d}, groups={groups}, kernel_size={k}) " \
            f"on a (4, {cin}, {H}, {W}) input, in train mode, with random norm parameters"
    hint = SPEC_HINT
    if built_with is not None:
        where = f"for LiteResidual({cin}, {cout}, stride={stride}, downsample={built_with}, groups={groups}, " \
                f"kernel_size={k}) whose .downsample was then set to {d}, on a (4, {cin}, {H}, {W}) input"
        hint = ("self.downsample holds the pooling factor and forward pools by it, read when forward runs: "
                "setting .downsample after construction (section 7 does) changes the pooling")
    check_close(got["y"], y.detach().float(), f"the output {where}", hint, **TOL)
    check_close(got["dx"], xr.grad.float(), f"the input gradient {where}", SPEC_HINT, **TOL)
    for role, name in roles.items():
        check_close(got["grads"][name], p[role].grad.float(), f"the gradient of {name} {where}", SPEC_HINT, **TOL)


@hidden_test("test_LiteResidual")
def check_lite_residual(nb):
    # Shapes and zeros: strides 1 and 2, odd sizes, pooling from none to coarser than the map.
    for i, (cin, cout, stride, d, groups, k, H, W) in enumerate([
            (6, 10, 1, 2, 2, 5, 7, 9), (6, 10, 2, 2, 2, 5, 7, 9), (4, 6, 1, 1, 2, 3, 7, 9), (4, 6, 2, 4, 1, 5, 7, 9),
            (8, 8, 2, 4, 4, 3, 8, 8), (3, 6, 1, 8, 3, 5, 7, 9), (1, 5, 1, 2, 1, 5, 8, 8)]):
        _check_shape_and_zero(nb, cin, cout, stride, d, groups, k, H, W, seed=10 + i)
    # Values and gradients against the reference, after γ and the norms are moved away from init.
    for i, (cin, cout, stride, d, groups, k, H, W) in enumerate([
            (6, 10, 1, 2, 2, 5, 7, 9), (6, 4, 2, 2, 2, 3, 7, 9), (4, 6, 1, 4, 2, 5, 9, 7), (4, 6, 1, 1, 1, 3, 5, 6)]):
        _check_reference(nb, cin, cout, stride, d, groups, k, H, W, seed=40 + 10 * i)
    # self.downsample holds the factor that forward pools by: set after construction, as section 7 does.
    _check_reference(nb, 6, 4, 1, 4, 2, 3, 9, 7, seed=90, built_with=2)


POOL_HINT = ("a tensor at the input's full resolution is kept. nn.AvgPool2d / F.avg_pool2d keep their whole input "
             "for backward (only to know its shape); pool with avg_pool_lean, and keep nothing of x yourself")


@hidden_test("test_LiteResidual_memory")
def check_lite_residual_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    _check_lite_memory(nb, meter, draw(*LITE_BATCH, multiple_of=8))


# (arguments by position: in_channels, out_channels, stride, downsample, groups, kernel_size), what is wrong
BAD_ARGUMENTS = (
    ((0, 8, 1, 2, 1, 5), "in_channels=0 (a channel count below 1)"),
    ((8, 0, 1, 2, 1, 5), "out_channels=0 (a channel count below 1)"),
    ((8, 8, 0, 2, 2, 5), "stride=0"),
    ((8, 8, -2, 2, 2, 5), "stride=-2"),
    ((8, 8, 1, 0, 2, 5), "downsample=0"),
    ((8, 8, 1, 2, 2, -1), "kernel_size=-1 (below 1, though odd)"),
    ((8, 8, 1, 2, 2, 4), "an even kernel_size=4 (no 'same' padding)"),
    ((8, 8, 1, 2, 0, 5), "groups=0"),
    ((8, 8, 1, 2, 3, 5), "groups=3, which does not divide 8 channels"),
    ((6, 8, 1, 2, 4, 5), "groups=4, which does not divide 6 input channels"),
    ((8, 6, 1, 2, 4, 5), "groups=4, which does not divide 6 output channels"),
)


@hidden_test("test_LiteResidual_edge_cases")
def check_lite_residual_edge_cases(nb):
    for bad, what in BAD_ARGUMENTS:
        names = fetch(nb.apply(probes.raised, nb.LiteResidual, *bad))
        if names is None or "ValueError" not in names:
            got = "returned a module" if names is None else f"raised {names[0]}"
            raise AssertionError(
                f"LiteResidual{bad} {got}: {what} should raise ValueError (check every argument in __init__, before "
                "building the layers: channel counts, stride, downsample and kernel_size at least 1, kernel_size odd, "
                "groups at least 1 and dividing both channel counts)")
    # The smallest valid arguments are accepted: 1 channel, stride 1, no pooling, a 1×1 kernel, one group.
    for args, H, W in (((1, 1, 1, 1, 1, 1), 5, 6), ((4, 4, 2, 8, 4, 1), 7, 9)):
        names = fetch(nb.apply(probes.raised, nb.LiteResidual, *args))
        if names is not None:
            raise AssertionError(f"LiteResidual{args} raised {names[0]}: these arguments are valid (every value at "
                                 "least 1, an odd kernel_size, groups dividing both channel counts)")
        expected = (3, args[1], math.ceil(H / args[2]), math.ceil(W / args[2]))
        shape = tuple(fetch(_lite(nb, *args)(_randn(3, args[0], H, W, seed=95))).shape)
        if shape != expected:
            raise AssertionError(f"LiteResidual{args} on a (3, {args[0]}, {H}, {W}) input returned shape {shape}, "
                                 f"expected {expected}: (ceil(H / stride), ceil(W / stride)), whatever the pooling")


LITE_BATCH = (96, 160)  # the large memory case's batch, drawn at grading time (the docstring states the range)
LITE_CASE = (32, 32, 4)  # its channels (in and out), side and downsample (groups 2, kernel 5)


def _lite_values(roles: dict[str, str], C: int, seed: int) -> dict[str, torch.Tensor]:
    """Random parameters for a LiteResidual(C, C, groups=2, kernel_size=5), by name: γ away from 0, so that
    the branch's output and its input gradient depend on every layer."""
    shapes = {"conv": (C, C // 2, 5, 5), "norm_w": (C,), "norm_b": (C,), "pointwise": (C, C, 1, 1),
              "final_w": (C,), "final_b": (C,)}
    scale = {"conv": 0.2, "pointwise": 0.3}
    return {roles[r]: _randn(*shapes[r], seed=seed + i) * scale.get(r, 1.0) for i, r in enumerate(ROLES)}


def _loss_and_sample(module, x, w, index):
    """``module(x)``, weighted by ``w`` and summed (its graph alive), and the output's entries at ``index``
    (flat positions), detached."""
    y = module(x)
    return y.mul(w).sum(), y.detach().flatten().index_select(0, index)


def _check_lite_memory(nb, meter: Meter, B: int) -> None:
    """What the lite residual keeps between forward and backward, read from outside the student's process on
    a large input that nothing else holds, with random parameters; on the same call, the loss, a sample of
    the output and the input gradient's sum against the reference."""
    C, H, d = LITE_CASE
    where = f"LiteResidual({C}, {C}, downsample={d}) on a {(B, C, H, H)} input"
    lite = nb.LiteResidual(C, C, 1, d, 2, 5)
    table = fetch(nb.apply(probes.param_table, lite))
    roles = _roles([{"name": n, "shape": row["shape"]} for n, row in table.items()], C, C, 2, 5)
    seed = new_seed()
    values = _lite_values(roles, C, seed)
    nb.apply(probes.ch05_set_parameters, lite, values)
    lite(fresh_tensor(nb, (2, C, H, H))).sum().backward()  # warm up: lazily loaded code, first gradients
    w = seeded((1, C, H, H), seed=seed + 10)
    index = torch.randperm(B * C * H * H, generator=torch.Generator().manual_seed(seed + 11))[:64]
    held, (loss, sample) = meter.held_by(lambda x, w: _loss_and_sample(lite, x, w, index),
                                         inputs=lambda: [meter.tensor((B, C, H, H), seed=seed + 12), meter.put(w)])
    pooled = B * C * (H // d) ** 2 * 4
    w_bytes = w.numel() * 4  # the grader's loss keeps its weights for backward
    if held.kept > 6 * pooled + w_bytes + MiB:
        # Explained from inside the process (a claim its code controls) only now that the outside reading decided.
        small = fetch(nb.apply(probes.ch05_lite_run, _lite(nb, 16, 16, 1, 2, 2, 5), _randn(4, 16, 16, 16, seed=90),
                               _randn(4, 16, 16, 16, seed=91)))
        raise AssertionError(
            f"{where}: between forward and backward, with the input and output released, your process still held "
            f"{mib(held.kept - w_bytes)} more than before (read from outside your process), while the branch's four "
            f"tensors at the pooled resolution take {mib(4 * pooled)} and the input alone {mib(B * C * H * H * 4)} "
            f"(on a (4, 16, 16, 16) input your branch saves {small['activation_bytes']:,} bytes for backward, where "
            f"its four pooled tensors take {4 * 4 * 16 * 8 * 8 * 4:,}): {POOL_HINT}")
    # The same call's values, against the reference on the same inputs (pooled first: with whole d × d windows the
    # input gradient sums to the pooled one's, and the weighted sum of the upsampled output is that of the small
    # output with the upsampling's adjoint applied to the weights).
    p = {role: (values[name] if name in values else table[name]["value"]).double().requires_grad_(True)
         for role, name in roles.items()}
    pooled_x = F.avg_pool2d(seeded((B, C, H, H), seed=seed + 12), d).double().requires_grad_(True)
    h = F.conv2d(pooled_x, p["conv"], padding=2, groups=2)
    h = torch.relu(_bn_train(h, p["norm_w"], p["norm_b"]))
    h = _bn_train(F.conv2d(h, p["pointwise"]), p["final_w"], p["final_b"])  # (B, C, H / d, H / d)
    small = torch.zeros(1, C, H // d, H // d, dtype=torch.float64, requires_grad=True)

    def up(t):
        return F.interpolate(t, size=(H, H), mode="bilinear", align_corners=False)

    w_small, = torch.autograd.grad((up(small) * w.double()).sum(), small)
    ref = (h * w_small).sum()
    ref.backward()
    terms = (h.detach() * w_small).abs().sum().item()
    b, rest = index // (C * H * H), index % (C * H * H)
    ref_sample = up(h.detach()[b]).flatten(1)[torch.arange(len(index)), rest].float()
    del h
    loss_value = float(fetch(loss))
    if not abs(loss_value - ref.item()) <= 1e-5 * terms + 1e-4:
        raise AssertionError(f"{where}, with random parameters, on the call measured: the sum of the output "
                             f"weighted by the grader's random weights is {loss_value:.6g}, expected {ref.item():.6g}. "
                             f"{SPEC_HINT}")
    check_close(fetch(sample), ref_sample, f"a sample of the output of {where}, on the call measured", SPEC_HINT, **TOL)
    loss.backward()
    dx = float(fetch(held.leaves[0].grad))
    expected = pooled_x.grad.sum().item()
    if not abs(dx - expected) <= 1e-5 * pooled_x.grad.abs().sum().item() + 1e-4:
        raise AssertionError(f"{where}, on the call measured: the input gradient sums to {dx:.6g}, expected "
                             f"{expected:.6g}. {SPEC_HINT}")


# --- apply_tinytl ---------------------------------------------------------------------------------
def _target_batch(n: int, offset: int = 0):
    _, target = digits_tasks()
    return target.train.x[offset:offset + n], target.train.y[offset:offset + n]


BLOCK_SHAPES = [([1, 8, 8], [32, 8, 8]), ([32, 8, 8], [64, 8, 8]), ([64, 8, 8], [64, 4, 4]), ([64, 4, 4], [128, 4, 4])]
RELU_ELEMENTS = sum(math.prod(out) for _, out in BLOCK_SHAPES)  # per image, one ReLU output per block


MAIN_BATCH = (768, 1536)  # the main branch's memory case, drawn at grading time (the docstring states the range)


def _check_main_branch_held(nb, meter: Meter, batch: int) -> None:
    """The main branch's memory, read from outside the student's process: what a training forward keeps
    (graph alive, input released) once the course's stand-in, which adds exact zeros and keeps nothing, has
    taken the place of every LiteResidual. Only the 1-bit masks, the classifier's input and the output may
    remain. Nothing measured of a student object is subtracted. On the same call, the output and the input
    gradient's sum against the pretrained model's (the lite residuals add zeros)."""
    model = nb.apply_tinytl(meter.put(load_pretrained_cnn(seed=5)))
    shapes = [(out[0], h // out[1]) for (_, h, _), out in BLOCK_SHAPES]
    swap = fetch(nb.apply(probes.ch05_swap_lite, model, shapes))
    if swap["error"] or swap["found"] != len(BLOCK_SHAPES) or swap["remaining"] or swap["placed"] != len(BLOCK_SHAPES):
        raise AssertionError(
            f"the grader measures the main branch with its own stand-in in place of each LiteResidual module of the "
            f"model apply_tinytl returned, and could not: {len(BLOCK_SHAPES)} LiteResidual modules expected, "
            f"{swap['found']} found, {swap['placed']} replaced" + (f" ({swap['error']})" if swap["error"] else "")
            + ". Put each LiteResidual in the model as a submodule (e.g. Beside(block, lite)), one per block")
    model.train()
    seed = new_seed()
    try:
        model(fresh_tensor(nb, (2, 1, 8, 8))).sum().backward()  # warm up: lazily loaded code, first gradients
        held, out = meter.held_by(lambda x: model(x), inputs=lambda: [meter.tensor((batch, 1, 8, 8), seed=seed)])
    except Exception as e:  # noqa: BLE001 - only the stand-in's own complaint becomes this cell's message
        if CH05_REPLACED not in str(getattr(e, "message", e)):
            raise
        raise AssertionError(f"a training forward of the TinyTL model on {batch} images: {CH05_REPLACED}") \
            from None
    masks = sum(-(-batch * math.prod(o) // 8) for _, o in BLOCK_SHAPES)
    kept_ok = masks + batch * 128 * 4 + batch * 5 * 4  # masks, the classifier's input, the output
    if held.kept > kept_ok + 2 * MiB:
        # Explained from inside the process (a claim its code controls) only now that the outside reading decided.
        x, y = _target_batch(24)
        saved = fetch(nb.apply(probes.ch05_saved_split, model, x, y))  # the same model, stand-ins in place
        big = sorted(saved["outside"]["tensors"], key=lambda t: -t[2])[:4]
        raise AssertionError(
            f"a training forward of the TinyTL model on {batch} images, with the grader's stand-in (exact zeros, "
            f"nothing kept) in place of every LiteResidual, kept {mib(held.kept)} between forward and backward (read "
            f"from outside your process): the main branch's 1-bit ReLU masks take {mib(masks)}, the classifier's input "
            f"and the output {mib(kept_ok - masks)}, fp32 ReLU outputs would take {mib(batch * RELU_ELEMENTS * 4)}. "
            f"On a batch of 24 the largest tensors your model saves for backward are {big}. Replace each "
            "block's ReLU by ReLU1bit() (relu_packed as a module) and keep every original weight frozen")
    # The same call's values: with the lite residuals adding zeros, the pretrained model's output and gradient.
    base = load_pretrained_cnn(seed=5).eval()  # frozen BatchNorms stay on their running statistics in train mode
    x = seeded((batch, 1, 8, 8), seed=seed).requires_grad_(True)
    ref = base(x)
    where = f"the TinyTL model on {batch} random images, on the call measured (the lite residuals replaced by zeros)"
    check_close(fetch(out), ref.detach(), f"the output of {where}",
                "the main branch must compute the pretrained blocks: frozen weights, BatchNorms on their running "
                "statistics, ReLU1bit in place of each ReLU", atol=1e-5, rtol=1e-5)
    w = seeded((batch, 5), seed=seed + 1)
    out.mul(w).sum().backward()
    (ref * w).sum().backward()
    dx, expected = float(fetch(held.leaves[0].grad)), x.grad.sum().item()
    if not abs(dx - expected) <= 1e-4 * x.grad.abs().sum().item() + 1e-4:
        raise AssertionError(f"the input gradient of {where} sums to {dx:.6g}, expected {expected:.6g}: relu_packed "
                             "passes the gradient where its input is positive, like ReLU")


@hidden_test("test_apply_tinytl")
def check_apply_tinytl(nb):
    base = load_pretrained_cnn(seed=3)
    x, y = _target_batch(24)
    with torch.no_grad():
        ref = base.eval()(x)
    got = fetch(nb.apply(probes.ch05_tinytl_describe, nb.apply_tinytl, load_pretrained_cnn(seed=3), x))
    if got["returned"] != "the same model":
        raise AssertionError(f"apply_tinytl returned {got['returned']}: it changes the model in place and returns it")
    check_close(got["y_eval"], ref, "the output at init (eval mode)",
                "the lite residuals must add exact zeros at init, and nothing else may change", atol=1e-5, rtol=1e-5)
    check_close(got["y_train"], ref, "the output at init (train mode)",
                "in train mode too: the original BatchNorm weights are frozen (TransferCNN.train() then keeps them "
                "on their running statistics) and the lite residuals add zeros", atol=1e-5, rtol=1e-5)
    # The trainable set.
    original = [p for p in got["params"] if p["original"] is not None]
    new = [p for p in got["params"] if p["original"] is None]
    wrong = [p["original"] for p in original
             if p["requires_grad"] != (p["original"].endswith(".bias") or p["original"].startswith("classifier."))]
    if wrong:
        raise AssertionError(
            f"original parameters with the wrong requires_grad: {wrong}. TinyTL trains the biases and the classifier "
            "only: every original weight (conv and BatchNorm) is frozen, every bias trains")
    outside = [p["name"] for p in new if not p["inside"]]
    if outside:
        raise AssertionError(f"new parameters outside any LiteResidual: {outside}. The only parameters apply_tinytl "
                             "adds are those of the LiteResidual modules beside the blocks")
    frozen = [p["name"] for p in new if not p["requires_grad"]]
    if frozen:
        raise AssertionError(f"lite residual parameters that do not require grad: {frozen}. Freeze the original "
                             "weights before adding the lite residuals, whose parameters all train")
    calls = [[i[1:], o[1:]] for i, o in got["calls"]]
    if calls != [[list(i), list(o)] for i, o in BLOCK_SHAPES]:
        raise AssertionError(
            f"the LiteResidual modules were called with (input, output) shapes {calls} (batch dimension left out), "
            f"expected one per block, fed with the block's input: {[list(s) for s in BLOCK_SHAPES]}")
    # The groups rule (2 where 2 divides both channel counts, else 1) and the default 5×5 kernel show in the
    # number of new parameters: per block, the k×k group conv, the pointwise conv and two norms' γ and β.
    expected = 0
    for block in base.blocks:
        cin, cout = block.conv.in_channels, block.conv.out_channels
        groups = 2 if cin % 2 == 0 and cout % 2 == 0 else 1
        expected += cout * (cin // groups) * 25 + cout * cout + 4 * cout
    added = sum(p["numel"] for p in new)
    if added != expected:
        raise AssertionError(
            f"the lite residuals hold {added:,} parameters in all, expected {expected:,}: one "
            "LiteResidual(in, out, stride) per block with its default 5×5 kernel and the groups rule (groups=2 when "
            "2 divides both channel counts, else 1)")


@hidden_test("test_apply_tinytl_memory")
def check_apply_tinytl_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    _check_main_branch_held(nb, meter, draw(*MAIN_BATCH, multiple_of=64))


@hidden_test("test_apply_tinytl_trains")
def check_apply_tinytl_trains(nb):
    # It trains: the loss goes down and every trainable parameter moves.
    xb, yb = _target_batch(48, offset=100)
    run = fetch(nb.apply(probes.ch05_train_steps, nb.apply_tinytl(nb.put(load_pretrained_cnn(seed=4))), xb, yb, 6, 1e-2))
    losses = run["losses"]
    if not losses:
        raise AssertionError("the model apply_tinytl returned has no parameter that requires grad: the biases, the "
                             "lite residuals and the classifier train")
    if len(losses) < 2 or not losses[-1] < losses[0] - 0.05:
        raise AssertionError(f"six Adam steps (lr 1e-2) on one batch lowered the loss by less than 0.05: {losses}. "
                             "Does the lite residuals' output stay in the graph (not detached), and do the biases, "
                             "the lite residuals and the classifier require grad?")
    still = [n for n, moved in run["changed"].items() if not moved]
    if still:
        raise AssertionError(f"after six Adam steps these trainable parameters never changed: {still}. Do gradients "
                             "reach the lite residuals and the biases? A detached branch output never learns; "
                             "relu_packed passes gradients where x > 0")
