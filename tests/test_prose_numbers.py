"""Measured numbers come from the run: none is typed into a chapter's prose.

A measured figure typed into markdown goes stale as soon as the code, a seed or a size changes,
and nothing notices. So in every chapter source (``solutions/*.py``) a number that reads like a
measurement, i.e. one with a unit (bytes, KB/KiB/MB/GB, %, ×, x, "times", ms, s, bits, FLOPs,
points) or with thousands separators, may stand only

- in code output: printed or formatted from variables by the run, so it is not in the source;
- in a phrase listed in ``LITERAL`` for its chapter: a definition ("4 bytes" per fp32 value),
  arithmetic on definitions, or a figure quoted from a paper (the phrase names the paper or says
  "paper"). Only the numbers inside a listed phrase are exempt, and a listed phrase that no
  longer occurs fails too, so the list cannot silently grow stale or cover a new number.

Both markdown cells and the string literals of code cells are read: a sentence printed with
the number typed into it is still typed. Format specifications (``{x:.1%}``) are not literals.
Nothing is executed, so the test is cheap.

Chapters listed in ``PENDING`` are being rewritten and still type numbers into prose: the test
xfails for them and lists every number it finds (``pytest -rx``). Each is either moved into
code output or, if it is a definition or a quoted figure, listed in ``LITERAL`` with its phrase;
a pending chapter with nothing left to list fails until it leaves ``PENDING``.
"""
from __future__ import annotations

import ast
import re

import jupytext
import pytest

from conftest import ROOT
from grader.notebooks import chapters

_UNIT = (r"(?:[KMGT]i?B\b|kB\b|(?:kilo|mega|giga|tera|kibi|mebi|gibi)?bytes?\b|bits?\b|\\?%|(?:per ?cent)\b"
         r"|×(?!\s?\d)|x\b|times\b|ms\b|s\b|(?:milli)?seconds?\b|minutes?\b|[KMGT]?FLOPs?\b|points?\b)")
_NUMBER = r"(?<![\w.^])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_WORDS = r"(?i:\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|hundred|thousand)"
MEASURED = re.compile(rf"{_NUMBER}\$?\s?{_UNIT}"  # a number with a unit
                      r"|(?<![\w.^])\d{1,3}(?:,\d{3})+(?:\.\d+)?"  # or with thousands separators
                      rf"|{_WORDS}(?:[- ]fold|\s+times)\b)")  # or in words


# Per chapter: phrases whose numbers are definitions, arithmetic on definitions or quoted figures.
LITERAL: dict[str, list[str]] = {
    "ch00_memory": [
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "values × 4 bytes",  # fp32
        "= 352$ bytes for $B = 4$",  # the sum of the saved widths, derived above the line
        "MobileNetV2-1.4 has 4.3× fewer parameters than ResNet-50, but its training activations are only 1.1× smaller",
        "about 6.9× its parameter size",  # TinyTL Figure 1
        "784 times fewer pixels",  # (224 / 8)²
        "4.3× (ResNet-50 / MobileNetV2-1.4)", '"1.1×"', "≈ 6.9× (224×224 images)",  # the paper column
        "reach 6.9× its parameter bytes, the ResNet-50 ratio",
    ],
    "ch01_lora": [
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "20% of the tokens are random noise", "(100% is possible)",  # how the task is defined
        "by 10,000× and GPU memory by 3× (training VRAM 1.2 TB → 350 GB;",  # LoRA abstract, §4.2
        "shrinks from 350 GB to 35 MB", "19.8 ms (fine-tuned or LoRA) vs 23.9 ms and 25.8 ms",
        "(+20.7%, +30.3%)", "within 0.4% of full fine-tuning while adding 3.6% parameters",  # LoRA Table 1; Houlsby
        "abstract says 0.8%; the arXiv version says 0.4%",
        "GPT-3's 350 GB with LoRA", "(175·10⁹ × 2 bytes)", "some 850 GB",  # arithmetic on the paper's figures
        "within 2 points of full fine-tuning",  # the tolerance the notebook applies
        '"10,000× (GPT-3 175B)"', '"3× (1.2 TB → 350 GB)"', '"1.00× (no added latency)"',
        '"1.21× and 1.30× (two designs, GPT-2 medium)"', '"3.6% of the model"', '"0.4 points (GLUE)"',
    ],
    "ch02_checkpointing": [
        "1,000-layer ResNet in 7 GB instead of 48 GB for about 30% more time",  # Chen et al. abstract
        "a 1,000-layer ResNet drops from 48 GB to 7 GB of feature-map memory for about 30% more",
        '"48 GB / 7 GB = 6.9× (1,000 layers)"', '"1000 / 63 = 15.8×"', '"≈ 30% time"',
        "no plan fits in 18 bytes here",  # the visible test's own data
        "cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
    ],
    "ch03_accumulation": [  # 1/B and 1/√B for 32 against 256
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "$256/32 = 8$ times the variance, so $\\sqrt 8 \\approx 2.8$ times the noise in standard deviation, not 8 times",
        "8 times the variance is less than 3 times the noise",
    ],
    "ch04_partial_training": [
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "with 1 MiB of slack",  # a memory check's allowance (grader/hidden)
        "keeps nothing else (32× smaller)", "32 bits per element", "packed 8 to a byte, 32× smaller",  # fp32 vs 1 bit
        '"15 ones: 8 + 7 bits"', '"9 bits need 2 uint8 bytes, got "',  # the visible test's own data
        "BN + last layer trains about 12× fewer parameters than full fine-tuning but needs only about 1.8× less "
        "memory; bias + last layer needs 12× less memory but is 16.3 points less accurate",  # TinyTL, lecture figures
        '"≈ 12×"', '"≈ 1.8×"', '"12×"', '"16.3 points"', "the paper's 12×",
    ],
    "ch05_tinytl": [
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "with 8 KiB of slack", "with 1 MiB of slack", "with 2 MiB of slack",  # memory checks' allowances
        "a ReLU that keeps 32× less", "output (32 bits)",  # fp32 vs 1 bit
        "up to 6.5× less memory than full fine-tuning at similar accuracy; the lite residuals cost ~3.8% of the "
        "memory; bias+last is ~12× less memory but 16.3% less accurate than full, and the lite residual wins back "
        "+11.6% accuracy for +5 MB; BN+last trains ~12× fewer parameters than full but saves only ~1.8× memory",  # TinyTL
        '"up to 6.5×"', '"up to 6.5× (memory)"', '"~12×"', '"~1.8×"', '"~3.8% of memory"', "(the paper: up to 6.5×)",
    ],
    "ch06_sparse_backprop": [
        "within 60 s and 4 GiB",  # the grader's limits per graded cell
        "(1,400 training and 397 test images)",  # the split defined in code
        "from 170 s to 29 s at top-80 (5.9×) with accuracy 98.20% → 98.27%; a POS-tagging LSTM's from 16,167 s to "
        "436 s at top-10 (37.1×), 97.22% → 97.25%; 1–4% of the weights",  # meProp paper and repository
        '"5.9× (170 s → 29 s)"', '"1–4%"', '"37.1×"', "the paper's 5.9× and 37×",
    ],
    "ch07_local_loss": [
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "CIFAR-10 VGG8b: 94.42% vs 94.01% (error 5.58 vs 5.99)",  # Nøkland & Eidnes, README (test error)
        "CIFAR-10: 91.60% / 92.84%, both below predsim",  # pred and sim alone: 100 − 8.40, 100 − 7.16
        "85.05% vs 85.2–85.6%",  # DGL's released logs, CIFAR-10 3-layer CNN
    ],
    "ch08_quantization": [  # bit widths and their arithmetic
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "spend their 16 bits", "its memory cost: 4.5 bits per parameter", "integers in 16 bits",
        "keeps the top 16 bits of the 32. Just dropping the low 16 bits",
        "Plant one outlier (50×) in a Gaussian tensor and quantize it to 4 bits", '"4 bits, block "',  # set in code
        "the first 8 of 9 points", "the first 7 of 8 points",  # NF4's construction
        "$4 + 32/64 = 4.5$ bits per value", '"ceil(7 / 2) = 4 bytes of uint8"',
        '"NF4 should keep normal weights within about 10% relative error"',  # the visible test's threshold
        "stores the weights in 4 bits", "4 bits cost ", "eight times more (on average less)",  # 2^-8 / 2^-11
        "even at 4 bits", "quantized to 8 bits in blocks of 256", "the textbook numbers: 4.5 bits for NF4",
        "from 2 to 8 bits", "from 5 bits on", "4.5 bits instead of 16 (or 32) per parameter",
        "(float32 → 4.5 bits is", '"test loss at 4.5 bits per weight, int4 / NF4"',
        "costs 32/64 = 0.5 bits per parameter for the constants; double quantization brings that to "
        "8/64 + 32/(64·256) = 0.127, saving 0.373 bits per parameter",  # QLoRA §3
        "from more than 780 GB to less than 48 GB", "65B fine-tuned on one 48 GB GPU",  # QLoRA abstract
        '"32 / 4.5 = 7.1× (32 / 4.127 = 7.8× with double quantization)"',
        "(10 bits, every integer up to 2048)", "with 7 bits of mantissa",
        "at the same 4.5 bits; double quantization brings the cost to ≈ 4.127 bits",
    ],
    "ch09_mixed_precision": [  # 16-bit formats: half of float32's bytes
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "Training entirely in 16 bits", "runs the rest in 16 bits", "profit from 16 bits",
        "8 bits instead of 11",  # bf16 and fp16 significands
        "Paper: about 5% of the weight gradients", 'memory "nearly 2×" smaller',  # Micikevicius et al.
        '"≈ 5% (speech model)"', '"nearly 2×"', "the paper's 2×", "by less than 2× when",
    ],
    "ch10_flash_attention": [
        "Each graded cell may use 60 s and 4 GiB",  # the grader's limits per graded cell
        "one layer's $P$ alone is 16 GB in fp32",  # 16K² × 16 heads × 4 bytes
        "(40–80 GB), delivers about 1.5–2 TB/s", "holds only 192 KB, but all of it together delivers about 19 TB/s",
        "computes 312 TFLOP/s in bf16: to keep up, an operation must do about 150 FLOPs",  # FlashAttention §2.1
        "an A100's 192 KB", '" 192 KB"',
        "standard attention does 66.6 GFLOPs with 40.3 GB of HBM reads and writes in 41.7 ms; FlashAttention "
        "75.2 GFLOPs, 4.4 GB, 7.3 ms", "up to 20× below exact-attention baselines; 3× faster GPT-2 training",
        "50–73% of the A100's peak",  # FlashAttention Fig. 2, abstract; FlashAttention-2
        '"75.2 / 66.6 = 1.13×"', '"40.3 / 4.4 GB = 9.2×"', '"up to 20× (Fig. 3, long N)"',
        '"41.7 → 7.3 ms (5.7×); 3× end to end"', '"50–73% of A100 peak"', "the paper's 20×",
        "128 × N = 524,288 elements or more",  # the memory cells' rule: one block (128) times N = 4096
        "(64 × N elements or more)",  # the visible memory tests' rule at blocks of 64
    ],
}

# Chapters being rewritten that still type numbers into prose, with what a first reading found
# measured (to print from the run); the rest of what the test lists looks literal (to list above).
PENDING: dict[str, str] = {}


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _string_literals(source: str) -> list[str]:
    """The string constants of a code cell, f-strings' literal parts included, format specs excluded."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [source]  # not Python: read it all
    specs = {id(part) for node in ast.walk(tree) if isinstance(node, ast.FormattedValue) and node.format_spec
             for part in ast.walk(node.format_spec)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in specs]


def texts(chapter: str) -> list[str]:
    """Markdown cells and quoted code-cell string literals of a chapter source, whitespace folded."""
    out = []
    for cell in jupytext.read(ROOT / "solutions" / f"{chapter}.py").cells:
        if cell.cell_type == "markdown":
            out.append(_normalise(cell.source))
        elif cell.cell_type == "code":
            out += [_normalise(f'"{s}"') for s in _string_literals(cell.source)]
    return out


def typed_numbers(text: str, literal: list[str] = ()) -> list[str]:
    """Measured-looking numbers in ``text`` outside the ``literal`` phrases."""
    masked = text
    for phrase in literal:
        phrase = _normalise(phrase)
        masked = masked.replace(phrase, " " * len(phrase))
    return [m.group(0) for m in MEASURED.finditer(masked)]


def offenders(chapter: str) -> list[str]:
    return [n for t in texts(chapter) for n in typed_numbers(t, LITERAL.get(chapter, []))]


def test_detector_sees_typed_measurements():
    found = typed_numbers("about 10 MB, 12.5% less, 3× more, 2.8x slower, 9,850 KB, 1,234 rows, "
                          "7.3 ms, 0.5 bits, seven times fewer, 352$ bytes, 10 megabytes, 12 percent")
    assert found == ["10 MB", "12.5%", "3×", "2.8x", "9,850 KB", "1,234", "7.3 ms", "0.5 bits",
                     "seven times", "352$ bytes", "10 megabytes", "12 percent"], found
    assert typed_numbers("$k = \\sqrt{16} = 4$, 8×8 images, 224×224, $2^{n-1}$ plans, f(x) at x=3, rank 4") == []
    assert typed_numbers("from 48 GB to 7 GB, then 5 MB", ["from 48 GB to 7 GB"]) == ["5 MB"]


@pytest.mark.parametrize("chapter", chapters())
def test_literal_phrases_still_occur(chapter):
    body = " ".join(texts(chapter))
    stale = [p for p in LITERAL.get(chapter, []) if _normalise(p) not in body]
    assert not stale, f"{chapter}: LITERAL lists phrases the chapter no longer holds: {stale}"


@pytest.mark.parametrize("chapter", chapters())
def test_measured_numbers_come_from_the_run(chapter):
    found = offenders(chapter)
    if chapter not in PENDING:
        assert chapter in LITERAL, f"{chapter}: add it to LITERAL (with [] if it types no literal figures)"
        assert not found, (f"{chapter} types measured-looking numbers into prose: {found}. Print them from the "
                           "run, or, if a definition or a quoted figure, list its phrase in LITERAL")
        return
    assert found, f"{chapter} types no measured-looking number into prose any more: remove it from PENDING"
    pytest.xfail(f"{chapter} types {len(found)} measured-looking numbers into prose ({PENDING[chapter]}): "
                 f"{found}")
