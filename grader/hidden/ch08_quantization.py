"""Hidden tests of chapter 8 (number formats, quantization, QLoRA).

References are the naive math in float64, written here: bf16 rounding is compared with PyTorch's
own conversion bit for bit; absmax and NF4 codes are recomputed by brute force (the nearest level
by distance to all 16, the integer code by rounding in float64). Where a value lies within a hair
of a rounding boundary, either neighbour is accepted, since float32 arithmetic may land on either
side. QLoRA's memory is read from outside the student's process on a 4M-weight layer, after
construction and after a training step (``grader.resources``); the tensor inventory
(``probes.ch08_tensor_inventory``) names what was kept on the small layers.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from coursekit.checks import check_close, check_equal, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import MiB, Meter, fresh_tensor, mib
from grader.source_policy import Shortcut, SourcePolicy

# round_to_bf16 works on integer bits: no bfloat16 dtype (nor autocast, whose CPU dtype is bfloat16) in
# any exercise cell, since cells share one namespace; the course's NF4 kernel is not an answer either.
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(pattern=r"(?i)bfloat16|autocast",
             instead="round with integer operations on x.view(torch.int32), as round_to_bf16's docstring says"),
    Shortcut(paths=("kernels.ch08_quantization",),
             instead="write nf4_dequantize with torch operations; kernels.ch08_quantization is the course's own"),
))

# The NF4 levels as published (QLoRA, Appendix E; bitsandbytes); the student's must be computed.
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=torch.float64)
TIE = 1e-4  # |value - boundary| below which both neighbouring codes are accepted (in units of a step)

RNE_HINT = ("round to nearest, ties to even: add 0x7FFF plus the last kept bit ((bits >> 16) & 1), then clear the "
            "low 16 bits; truncating (just clearing them) or adding 0x8000 (ties away from zero) is not the same")
NAN_HINT = ("a NaN whose payload sits in the low 16 bits carries into an infinity when rounded like a number: "
            "keep NaNs apart (torch.where(torch.isnan(x), x, rounded))")
RANGE_HINT = "with q_max = 2 ** (bits - 1) - 1, scale = max|x| / q_max and every code lies in [-q_max, q_max]"
BLOCK_HINT = ("n values make ceil(n / block_size) blocks: pad the last, partial block with zeros instead of "
              "dropping it")
NF4_HINT = ("8 positive levels ndtri(linspace(delta, 0.5, 9)[:-1]), 7 negative levels "
            "-ndtri(linspace(delta, 0.5, 8)[:-1]) and 0, with delta = 1 - (1/32 + 1/30) / 2 = 0.9677083, sorted and "
            "divided by the largest; computed, not typed in")
NIBBLE_HINT = "the first value of each pair goes in the HIGH nibble: byte = (code[2k] << 4) | code[2k + 1]"
COPY_HINT = ("store only nf4_quantize's packed codes and absmax (as buffers), not the base layer nor any float copy "
             "of its weight, and dequantize in forward without keeping the result")


# --- helpers -----------------------------------------------------------------------------------
def _randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _raises_value_error(nb, fn_name: str, *args) -> bool:
    names = fetch(nb.apply(probes.raised, nb[fn_name], *args))
    return names is not None and "ValueError" in names


def _pair(got, what: str):
    if not isinstance(got, (list, tuple)) or len(got) != 2:
        raise AssertionError(f"{what} should return a pair of tensors, got {type(got).__name__}")
    return got


def _check_tensor(t, name: str, dtype: torch.dtype, shape, hint: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise AssertionError(f"{name} should be a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise AssertionError(f"{name} has dtype {t.dtype}, expected {dtype}")
    check_equal(tuple(t.shape), tuple(shape), f"the shape of {name}", hint)


def _codes_match(got: torch.Tensor, value: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                 near_boundary: torch.Tensor) -> torch.Tensor:
    """Where got is right: the nearest code, or either neighbour within a hair of the boundary."""
    return (got == torch.where(value - lower <= upper - value, lower, upper)) | (
        near_boundary & ((got == lower) | (got == upper)))


# --- round_to_bf16 -----------------------------------------------------------------------------
def _bits(values) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32)


def _bf16_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(8)
    rand = torch.randint(-2**31, 2**31 - 1, (211, 97), generator=g, dtype=torch.int64).to(torch.int32)
    high = torch.randint(0, 1 << 16, (4000,), generator=g, dtype=torch.int64)
    ties = ((high << 16) | 0x8000).to(torch.int32)  # exactly half-way: both parities of the last kept bit
    near = ((high << 16) | torch.tensor([0x7FFF, 0x8001]).repeat(2000)).to(torch.int32)
    sub = torch.randint(0, 1 << 23, (2000,), generator=g, dtype=torch.int64)
    sub = (sub | torch.tensor([0, 1 << 31]).repeat(1000)).to(torch.int32)  # subnormals of both signs
    edges = _bits([0x7F7F8000, 0x7F7FFFFF, 0x7F7F7FFF, 0xFF7F8000, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0, 1 << 31,
                   0x00008000, 0x00018000, 0x80008000, 0x3F808000, 0x3F818000, 0x00807FFF])
    nans = _bits([0x7F800001, 0x7F808000, 0x7FFFFFFF, 0x7FC00000, 0xFF800001, 0xFFFFFFFF, 0x7FBFFFFF, 0xFFC00001])
    return {"random bit patterns (211 x 97)": rand.view(torch.float32),
            "exact ties (low 16 bits = 0x8000)": ties.view(torch.float32),
            "values just below and above a tie": near.view(torch.float32).view(40, 100),
            "subnormals": sub.view(torch.float32),
            "edge cases (largest finite values rounding to inf, ±inf, ±0, ties)": edges.view(torch.float32),
            "NaNs with payloads": nans.view(torch.float32)}


@hidden_test("test_round_to_bf16")
def check_round_to_bf16(nb):
    for what, x in _bf16_inputs().items():
        out = fetch(nb.apply(probes.ch08_traced_call, nb.round_to_bf16, x))
        got = out["result"]
        _check_tensor(got, f"round_to_bf16 on {what}", torch.float32, x.shape, "float32 in, same shape out")
        if "torch.bfloat16" in out["dtypes"]:
            raise AssertionError("round_to_bf16 converts to torch.bfloat16 somewhere: implement the rounding with "
                                 "integer operations on x.view(torch.int32)")
        nan = torch.isnan(x)
        ref = x.to(torch.bfloat16).float().view(torch.int32)
        wrong = (got.view(torch.int32) != ref) & ~nan
        if wrong.any():
            i = tuple(int(k) for k in torch.nonzero(wrong)[0])
            raise AssertionError(
                f"on {what}: {int(wrong.sum())} of {x.numel()} values differ from x.to(torch.bfloat16).float(); "
                f"first: input bits 0x{x.view(torch.int32)[i].item() & 0xFFFFFFFF:08X} gave "
                f"0x{got.view(torch.int32)[i].item() & 0xFFFFFFFF:08X}, expected 0x{ref[i].item() & 0xFFFFFFFF:08X}. "
                f"{RNE_HINT}")
        if not torch.isnan(got[nan]).all():
            bad = x[nan][~torch.isnan(got[nan])][:1]
            raise AssertionError(f"a NaN (bits 0x{bad.view(torch.int32).item() & 0xFFFFFFFF:08X}) became "
                                 f"{got[nan][~torch.isnan(got[nan])][0].item()}. {NAN_HINT}")


# --- absmax quantization -------------------------------------------------------------------------
def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = x.double().flatten()
    n_blocks = -(-flat.numel() // block_size)
    out = torch.zeros(n_blocks * block_size, dtype=torch.float64)
    out[:flat.numel()] = flat
    return out.view(n_blocks, block_size)


def _absmax_inputs():
    x_zero = _randn(200, seed=5)
    x_zero[64:128] = 0.0  # an all-zero block
    x_spiky = _randn(11, 23, seed=6, scale=0.02)
    x_spiky[3, 7] = 3.0
    return [(_randn(37, 53, seed=1), 8, 64), (_randn(3, 5, 7, seed=2, scale=0.1), 4, 16), (_randn(1, seed=3), 2, 64),
            (_randn(1000, seed=4), 3, 1000), (x_zero, 5, 64), (_randn(6, 7, seed=7), 6, 1), (x_spiky, 4, 7),
            (_randn(97, seed=9, scale=1e3), 7, 10)]


@hidden_test("test_absmax_quantize")
def check_absmax_quantize(nb):
    for x, bits, block in _absmax_inputs():
        where = f"absmax_quantize(x of shape {tuple(x.shape)}, bits={bits}, block_size={block})"
        q_max = 2 ** (bits - 1) - 1
        blocks = _blocks(x, block)
        codes, scales = _pair(fetch(nb.absmax_quantize(x, bits, block)), where)
        _check_tensor(scales, f"the scales of {where}", torch.float32, (blocks.shape[0],), BLOCK_HINT)
        _check_tensor(codes, f"the codes of {where}", torch.int8, tuple(blocks.shape),
                      "codes are int8 of shape (n_blocks, block_size). " + BLOCK_HINT)
        has_values = bool((blocks.abs().amax(dim=1) > 0).any())
        if codes.abs().max() > q_max or (has_values and codes.abs().max() < q_max):
            raise AssertionError(f"{where}: codes span [{int(codes.min())}, {int(codes.max())}], expected the "
                                 f"largest magnitude of each block at ±{q_max}. {RANGE_HINT}")
        ref_scales = blocks.abs().amax(dim=1) / q_max
        check_close(scales, ref_scales.float(), f"the scales of {where}", RANGE_HINT, atol=0, rtol=2e-7)
        value = blocks / torch.where(ref_scales == 0, 1.0, ref_scales)[:, None]
        lower, upper = value.floor(), value.ceil()
        near = ((value - lower) - 0.5).abs() < TIE
        ok = _codes_match(codes.double(), value, lower, upper, near)
        if not ok.all():
            i = tuple(int(k) for k in torch.nonzero(~ok)[0])
            raise AssertionError(f"{where}: {int((~ok).sum())} codes differ from round(x / scale); first in block "
                                 f"{i[0]}, position {i[1]}: got {int(codes[i])}, "
                                 f"expected {value[i].round().item():.0f} "
                                 f"(x / scale = {value[i].item():.4f}; padding holds code 0). {RANGE_HINT}")
    for args, what in (((1, 64), "bits=1"), ((9, 64), "bits=9"), ((0, 64), "bits=0"), ((4, 0), "block_size=0"),
                       ((4, -3), "block_size=-3")):
        if not _raises_value_error(nb, "absmax_quantize", _randn(10, seed=0), *args):
            raise AssertionError(f"absmax_quantize(x, {args[0]}, {args[1]}) should raise ValueError ({what}): "
                                 "bits must be in 2..8 and block_size at least 1")


@hidden_test("test_absmax_dequantize")
def check_absmax_dequantize(nb):
    g = torch.Generator().manual_seed(11)
    for shape, bits, block in (((37, 53), 8, 64), ((3, 5, 7), 4, 16), ((5,), 3, 8), ((2, 3), 2, 1), ((97,), 8, 10)):
        n = math.prod(shape)
        n_blocks = -(-n // block)
        q_max = 2 ** (bits - 1) - 1
        codes = torch.randint(-q_max, q_max + 1, (n_blocks, block), generator=g).to(torch.int8)
        scales = torch.rand(n_blocks, generator=g) * 0.1
        scales[n_blocks // 2] = 0.0
        for as_size in (False, True):
            size = torch.Size(shape) if as_size else tuple(shape)
            where = f"absmax_dequantize(codes {tuple(codes.shape)}, scales {tuple(scales.shape)}, {block}, {size})"
            got = fetch(nb.absmax_dequantize(codes, scales, block, size))
            _check_tensor(got, where, torch.float32, shape, "the original shape, padding dropped")
            ref = (codes.double() * scales.double()[:, None]).flatten()[:n].reshape(shape)
            check_close(got, ref.float(), where, "value = code x the scale of its block (block i: elements "
                        "i * block_size .. (i + 1) * block_size - 1 of the flattened tensor)", atol=1e-7, rtol=1e-6)


# --- NF4 -----------------------------------------------------------------------------------------
@hidden_test("test_nf4_codebook")
def check_nf4_codebook(nb):
    got = fetch(nb.nf4_codebook())
    _check_tensor(got, "nf4_codebook()", torch.float32, (16,))
    if not (got[1:] > got[:-1]).all():
        raise AssertionError(f"nf4_codebook() is not strictly ascending: {got.tolist()}")
    if got[0] != -1 or got[-1] != 1 or (got == 0).sum() != 1:
        raise AssertionError(f"nf4_codebook() should start at exactly -1, end at exactly 1 and contain an exact 0, got "
                             f"{got[0].item()}, {got[-1].item()} and {(got == 0).sum().item()} zeros: {NF4_HINT}")
    check_close(got, NF4.float(), "nf4_codebook()", NF4_HINT, atol=1e-6, rtol=0)


def _nf4_reference_codes(x: torch.Tensor, block: int):
    """Brute force: the index of the nearest of the 16 levels to x / absmax, in float64."""
    blocks = _blocks(x, block)
    absmax = blocks.abs().amax(dim=1)
    scaled = (blocks / torch.where(absmax == 0, 1.0, absmax)[:, None]).flatten()[:x.numel()]
    dist = (scaled[:, None] - NF4[None, :]).abs()  # (n, 16)
    two = dist.topk(2, dim=1, largest=False)
    near = (two.values[:, 1] - two.values[:, 0]) < TIE * 1e-2
    return two.indices[:, 0], two.indices[:, 1], near, absmax


def _unpack(packed: torch.Tensor, n: int, high_first: bool = True) -> torch.Tensor:
    hi, lo = (packed >> 4).long(), (packed & 15).long()
    pairs = torch.stack([hi, lo] if high_first else [lo, hi], dim=1)
    return pairs.flatten()[:n]


def _nf4_inputs():
    x_zero = _randn(2, 65, seed=23, scale=0.02)
    x_zero[0, :64] = 0.0  # an all-zero block
    heavy = _randn(101, seed=24) / (_randn(101, seed=25).abs() + 0.3)  # heavy tails
    return [(_randn(37, 53, seed=21, scale=0.02), 64), (_randn(3, 5, 7, seed=22), 16), (torch.tensor([-0.7]), 64),
            (x_zero, 64), (heavy.view(1, 101), 7), (_randn(9, 15, seed=26, scale=3.0), 32)]


@hidden_test("test_nf4_quantize")
def check_nf4_quantize(nb):
    for x, block in _nf4_inputs():
        n = x.numel()
        where = f"nf4_quantize(x of shape {tuple(x.shape)}, block_size={block})"
        packed, absmax = _pair(fetch(nb.nf4_quantize(x, block)), where)
        best, second, near, ref_absmax = _nf4_reference_codes(x, block)
        _check_tensor(absmax, f"the absmax of {where}", torch.float32, (ref_absmax.numel(),), BLOCK_HINT)
        check_close(absmax, ref_absmax.float(), f"the absmax of {where}", "max |x| of each block", atol=0, rtol=0)
        _check_tensor(packed, f"the packed codes of {where}", torch.uint8, ((n + 1) // 2,),
                      "two 4-bit codes per byte: ceil(n / 2) bytes")
        codes = _unpack(packed, n)
        ok = (codes == best) | (near & (codes == second))
        if not ok.all():
            swapped = _unpack(packed, n, high_first=False)
            if n > 1 and ((swapped == best) | (near & (swapped == second))).all():
                raise AssertionError(f"{where}: the two codes of each byte are swapped. {NIBBLE_HINT}")
            i = int(torch.nonzero(~ok)[0])
            raise AssertionError(
                f"{where}: {int((~ok).sum())} of {n} codes differ from the nearest NF4 level; first at element {i}: "
                f"got code {int(codes[i])}, expected {int(best[i])} (level {NF4[best[i]].item():.4f} for x / absmax = "
                f"{(x.flatten()[i] / ref_absmax[i // block]).item():.4f}). The code is the index of the nearest level "
                f"of the ascending codebook (7 is 0.0, also for an all-zero block). {NIBBLE_HINT}")


@hidden_test("test_nf4_dequantize")
def check_nf4_dequantize(nb):
    g = torch.Generator().manual_seed(31)
    for shape, block in (((37, 53), 64), ((3, 5, 7), 16), ((7,), 4), ((1,), 64), ((11, 13), 10)):
        n = math.prod(shape)
        packed = torch.randint(0, 256, ((n + 1) // 2,), generator=g).to(torch.uint8)
        absmax = torch.rand(-(-n // block), generator=g) + 0.05
        absmax[0] = 0.0
        where = f"nf4_dequantize(packed {tuple(packed.shape)}, absmax {tuple(absmax.shape)}, {shape}, {block})"
        got = fetch(nb.nf4_dequantize(packed, absmax, shape, block))
        _check_tensor(got, where, torch.float32, shape, "the original shape")
        scale = absmax.double().repeat_interleave(block)[:n]
        ref = (NF4[_unpack(packed, n)] * scale).reshape(shape).float()
        swapped = (NF4[_unpack(packed, n, high_first=False)] * scale).reshape(shape).float()
        if n > 1 and same_close(got, swapped, atol=1e-6, rtol=1e-6) and not same_close(got, ref):
            raise AssertionError(f"{where}: the two codes of each byte are read in the wrong order. {NIBBLE_HINT}")
        check_close(got, ref, where, "value = nf4_codebook()[code] x absmax of its block, codes read high nibble "
                    "first", atol=1e-6, rtol=1e-6)


# --- QLoRALinear -----------------------------------------------------------------------------------
def _nf4_roundtrip(w: torch.Tensor, block: int) -> torch.Tensor:
    best, _, _, absmax = _nf4_reference_codes(w, block)
    return (NF4[best] * absmax.repeat_interleave(block)[:w.numel()]).reshape(w.shape).float()


def _check_storage(nb, layer, n_weight: int, n_out: int, block: int, where: str) -> None:
    inventory = fetch(nb.apply(probes.ch08_tensor_inventory, layer))
    copies = [t for t in inventory if t["floating"] and t["numel"] == n_weight]
    if copies:
        t = copies[0]
        raise AssertionError(f"{where} holds a full-precision copy of the base weight: {t['where']} ({t['dtype']}, "
                             f"{t['numel']} values). {COPY_HINT}")
    frozen = [t for t in inventory if t["where"] not in ("lora_A", "lora_B") and t["numel"] != n_out]
    budget = (n_weight + 1) // 2 + 4 * -(-n_weight // block)
    held = sum(t["nbytes"] for t in frozen)
    if held > budget + 256:
        raise AssertionError(f"{where} keeps {held:,} bytes for the frozen weight "
                             f"({', '.join(t['where'] + ' ' + t['dtype'] for t in frozen)}); NF4 needs "
                             f"{budget:,} (ceil(n / 2) bytes of packed codes + 4 bytes of absmax per block): store "
                             "two codes per byte, as nf4_quantize returns them")


def _check_held_memory(nb, meter: Meter, out_features: int = 2048, in_features: int = 2048, block: int = 64) -> None:
    """What the process holds for a large layer, read from outside it: after construction (the base
    Linear released) and again after a forward and backward pass (nothing cached in between)."""
    if not meter.strict:  # in-kernel, the judge's own large references share the process: read in the sandbox only
        return
    n = out_features * in_features
    linear = nb.put(nn.Linear)
    warm = nb.QLoRALinear(linear(64, 8, bias=False), 2, 4.0, block)
    warm(fresh_tensor(nb, (2, 64))).sum().backward()  # first call: lazily loaded code and caches
    del warm
    held, layer = meter.held_by(lambda: nb.QLoRALinear(linear(in_features, out_features, bias=False), 4, 8.0, block))
    budget = (n + 1) // 2 + 4 * -(-n // block) + MiB
    where = f"QLoRALinear(Linear({in_features}, {out_features}, bias=False), 4, 8.0, block_size={block})"
    if held.kept > budget:
        raise AssertionError(
            f"{where}: with the base layer released, your process still held {mib(held.kept)} more than before "
            f"(read from outside your process); the packed codes and absmax need {mib(budget - MiB)}, the float "
            f"weight is {mib(4 * n)}. {COPY_HINT}")
    after, _ = meter.held_by(lambda: layer(fresh_tensor(nb, (3, in_features))).sum().backward(),
                             budget + 3 * MiB)  # the layer itself is held by now
    if held.kept + after.kept > budget:
        raise AssertionError(
            f"{where}: after one forward and backward pass your process held {mib(held.kept + after.kept)} for "
            f"the layer (read from outside your process), {mib(after.kept)} more than after construction: "
            f"dequantize in every forward and keep nothing float between calls. {COPY_HINT}")


@hidden_test("test_qlora_linear")
def check_qlora_linear(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    for rank, alpha, block, bias, lead, seed in ((4, 8.0, 64, True, (2, 3), 1), (3, 1.5, 32, False, (5,), 2)):
        torch.manual_seed(seed)
        base = nn.Linear(37, 53, bias=bias)
        with torch.no_grad():
            base.weight.copy_(_randn(53, 37, seed=seed, scale=0.05))
        W0 = base.weight.detach().clone()
        b0 = None if not bias else base.bias.detach().clone()
        layer = nb.QLoRALinear(base, rank, alpha, block)
        where = f"QLoRALinear(Linear(37, 53, bias={bias}), {rank}, {alpha}, block_size={block})"
        _check_storage(nb, layer, W0.numel(), 53, block, where)

        table = fetch(nb.apply(probes.param_table, layer))
        trainable = sorted(n for n, row in table.items() if row["requires_grad"])
        check_equal(trainable, ["lora_A", "lora_B"], f"the trainable parameters of {where}",
                    "only lora_A and lora_B train; the NF4 weight and the bias are frozen")
        check_equal(table["lora_A"]["shape"], [rank, 37], "the shape of lora_A", "(rank, in_features) as in ch01")
        check_equal(table["lora_B"]["shape"], [53, rank], "the shape of lora_B", "(out_features, rank) as in ch01")
        A, B = table["lora_A"]["value"], table["lora_B"]["value"]
        if B.abs().max() != 0:
            raise AssertionError("lora_B is not zero at initialisation: the layer must start as the quantized base")
        if A.std() == 0 or A.abs().max() > 1 / math.sqrt(37) + 1e-6:
            raise AssertionError("lora_A should be initialised like nn.Linear's weight (random, within "
                                 "±1/sqrt(in_features)): nn.init.kaiming_uniform_(A, a=math.sqrt(5))")
        s = alpha / rank
        got_s = float(fetch(layer.scaling))
        if abs(got_s - s) > 1e-12:
            raise AssertionError(f"scaling is {got_s:g}, expected alpha / rank = {s:g}")

        Wq = _nf4_roundtrip(W0, block)
        fetch(layer.load_state_dict({"lora_B": _randn(53, rank, seed=seed + 10, scale=0.3)}, strict=False))
        B = fetch(layer.lora_B)
        x, g = _randn(*lead, 37, seed=seed + 20), _randn(*lead, 53, seed=seed + 30)
        out = fetch(nb.apply(probes.forward_backward, layer, x, g))
        xr = x.double().requires_grad_(True)
        Ar, Br = A.double().requires_grad_(True), B.double().requires_grad_(True)
        y = xr @ Wq.double().T + (0 if b0 is None else b0.double()) + s * (xr @ Ar.T) @ Br.T
        y.backward(g.double())
        if (out["y"].double() - (x.double() @ W0.double().T + (0 if b0 is None else b0.double()))).abs().max() < 1e-6:
            raise AssertionError(f"{where} computes with the original float weight: the output must use the NF4 "
                                 f"weight, dequantized from the stored codes. {COPY_HINT}")
        tol = dict(atol=1e-5, rtol=1e-5)
        check_close(out["y"], y.detach().float(), f"the output of {where}",
                    "y = x @ nf4_dequantize(codes, absmax).T + bias + (alpha / rank) (x A^T) B^T, with the layer's "
                    "block_size", **tol)
        check_close(out["dx"], xr.grad.float(), f"the input gradient of {where}", "", **tol)
        check_close(out["grads"]["lora_A"], Ar.grad.float(), f"the gradient of lora_A of {where}", "", **tol)
        check_close(out["grads"]["lora_B"], Br.grad.float(), f"the gradient of lora_B of {where}", "", **tol)
        extra = sorted(n for n, v in out["grads"].items() if v is not None and n not in ("lora_A", "lora_B"))
        if extra:
            raise AssertionError(f"{extra} received gradients: the frozen base (weight and bias) gets none")
        _check_storage(nb, layer, W0.numel(), 53, block, f"{where}, after a forward and backward pass,")

    _check_held_memory(nb, meter)
    for bad in (0, -1, 2.5):
        if not _raises_value_error(nb, "QLoRALinear", nn.Linear(37, 53), bad, 1.0):
            raise AssertionError(f"QLoRALinear(base, rank={bad!r}, alpha=1.0) should raise ValueError: rank must "
                                 "be a positive integer")
