"""The transfer-learning setting of the partial-training chapters (ch04, ch05).

A small CNN is pretrained on a *source* task and fine-tuned on a different *target* task, both
built from scikit-learn's 8×8 digits (shipped with the package, nothing is downloaded):

* source: the digits 0–4, upright (:func:`digits_tasks`);
* target: the digits 5–9, drawn in *negative* (ink and paper swapped) and rotated by 90°. The
  classes are new and the low-level statistics have changed, so the pretrained features are
  useful but not enough: a new classifier alone is weak, and what else is trained matters.

:class:`TransferCNN` is the network: conv blocks ``Conv2d(bias) → BatchNorm2d → ReLU`` in
``self.blocks`` and a linear ``self.classifier``. Its layers behave like PyTorch's own with one
memory difference, which the chapter measures: PyTorch's ``nn.Linear`` already keeps nothing
for backward when its weight is frozen (∂x = g W needs only W), but ``nn.Conv2d`` and
``nn.BatchNorm2d`` keep their input whatever is frozen. :class:`LeanConv2d` and
:class:`LeanBatchNorm2d` are drop-in subclasses that do not: a frozen convolution back-propagates
with ``conv2d_input`` (weights only), and a BatchNorm whose weight is frozen runs on its running
statistics as the affine map ``x · s + t`` (``s`` is a per-channel constant). Training mode
follows the same rule: :meth:`TransferCNN.train` leaves a BatchNorm with a frozen weight in eval
mode, the usual practice when its statistics are not being learned.

:class:`TransferMobileNet` is the second network, the kind TinyTL was designed for (chapter 5): a
small MobileNetV2 (a stem, then :class:`InvertedResidual` blocks with expansion 6, depthwise 3×3
convolutions and linear bottlenecks) on the same digits upsampled to ``MOBILENET_SIZE`` pixels a
side (``digits_tasks(size=...)``), built from the same lean layers and pretrained the same way
(``make checkpoints``). Its blocks expose ``.conv`` (the block's in/out channels and stride) and one
``.act`` like :class:`ConvBlock`, so per-block code written for :class:`TransferCNN` runs on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.models import SmallCNN, _check_widths, _seeded

CHECKPOINT = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "transfer_cnn_digits.pt"
MOBILENET_CHECKPOINT = CHECKPOINT.with_name("transfer_mobilenet_digits.pt")
MOBILENET_SIZE = 16  # the side of the images TransferMobileNet is pretrained and fine-tuned on


# --- data ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """Images (N, 1, 8, 8) in [0, 1] and labels (N,) in 0..num_classes−1."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Task:
    name: str
    train: Split
    test: Split
    num_classes: int


@lru_cache(maxsize=None)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8) in [0, 1]
    return x, torch.tensor(d.target, dtype=torch.long)


def _split(x: torch.Tensor, y: torch.Tensor, n_train: int, seed: int) -> tuple[Split, Split]:
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    tr, te = order[:n_train], order[n_train:]
    return Split(x[tr].clone(), y[tr].clone()), Split(x[te].clone(), y[te].clone())


def digits_tasks(target_train: int = 300, size: int = 8) -> tuple[Task, Task]:
    """The source and target tasks (deterministic).

    Args:
        target_train: labelled target images for fine-tuning (the rest, about 600, are the test
            set). Few labels on purpose: fine-tuning data is scarce on a device.
        size: side of the images: 8 (the original digits) or larger, a bilinear upsampling of them
            (same images, same splits: only the resolution the network works at changes).

    Returns:
        ``(source, target)``: source = digits 0–4 (about 720 train / 180 test);
        target = digits 5–9 in negative, rotated by 90°, labels 0–4 standing for 5–9.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an integer of at least 8 pixels, got {size!r}")
    x, y = _digits()
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    src = y < 5
    source = Task("digits 0-4", *_split(x[src], y[src], int(0.8 * int(src.sum())), seed=0), num_classes=5)
    if not 10 <= target_train <= 800:
        raise ValueError(f"target_train must be between 10 and 800 images, got {target_train}")
    xt = torch.rot90(1.0 - x[~src], k=1, dims=(2, 3))
    target = Task("digits 5-9, negative, rotated", *_split(xt, y[~src] - 5, target_train, seed=1), num_classes=5)
    return source, target


# --- layers that keep nothing they do not need -----------------------------------------------------
class _FrozenConv(torch.autograd.Function):
    """conv2d whose weight is frozen: backward needs only the weight, so no input is saved."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, groups):
        ctx.weight, ctx.shape, ctx.conf = weight, x.shape, (stride, padding, groups)
        ctx.has_bias = bias is not None and bias.requires_grad
        return F.conv2d(x, weight, bias, stride, padding, 1, groups)

    @staticmethod
    def backward(ctx, g):
        stride, padding, groups = ctx.conf
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.nn.grad.conv2d_input(ctx.shape, ctx.weight, g, stride, padding, 1, groups)
        db = g.sum(dim=(0, 2, 3)) if ctx.has_bias else None
        return dx, None, db, None, None, None


class LeanConv2d(nn.Conv2d):
    """``nn.Conv2d`` that saves no input when its weight is frozen (any groups, depthwise included;
    dilation 1 and zero padding: other convolutions behave exactly like ``nn.Conv2d``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = self.dilation != (1, 1) or self.padding_mode != "zeros"
        if self.weight.requires_grad or plain or not torch.is_grad_enabled():
            return super().forward(x)
        return _FrozenConv.apply(x, self.weight, self.bias, self.stride, self.padding, self.groups)


class LeanBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that, in eval mode with a frozen weight, is the affine map x·s + t.

    s = γ / √(running_var + ε) is a constant of shape (C,), so backward keeps only s (C numbers)
    instead of the whole input; t = β − running_mean · s still carries β's gradient.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.weight.requires_grad:
            return super().forward(x)
        with torch.no_grad():
            s = self.weight * torch.rsqrt(self.running_var + self.eps)
            shift = self.running_mean * s
        t = self.bias - shift
        return x * s[:, None, None] + t[:, None, None]


# --- the network ---------------------------------------------------------------------------------
class ConvBlock(nn.Sequential):
    """conv (3×3, bias) → bn → act: (B, c_in, H, W) → (B, c_out, H/stride, W/stride)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv = LeanConv2d(c_in, c_out, 3, stride=stride, padding=1, bias=True)
        self.bn = LeanBatchNorm2d(c_out)
        self.act = nn.ReLU()


class FrozenNormsStayEval(nn.Module):
    """``train()`` that leaves every BatchNorm whose weight is frozen in eval mode (on its running statistics)."""

    def train(self, mode: bool = True):
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d) and not m.weight.requires_grad:
                m.eval()
        return self


class TransferCNN(FrozenNormsStayEval, SmallCNN):
    """:class:`~coursekit.models.SmallCNN` built from :class:`ConvBlock`: (B, 1, 8, 8) → (B, num_classes).

    Args:
        widths: output channels of each block.
        strides: stride of each block (2 halves the resolution).
        num_classes: outputs of the ``classifier``.
        seed: initialisation seed.
    """

    def __init__(self, widths: Sequence[int] = (32, 64, 64, 128), strides: Sequence[int] = (1, 1, 2, 1),
                 num_classes: int = 5, seed: int = 0):
        super().__init__(widths, strides, num_classes, seed)

    def make_block(self, index: int, c_in: int, c_out: int, stride: int) -> nn.Module:
        return ConvBlock(c_in, c_out, stride)


# --- a MobileNetV2-style network -----------------------------------------------------------------
class InvertedConv(nn.Module):
    """The three convolutions of an inverted residual block, described from outside like one ``nn.Conv2d``.

    ``in_channels``, ``out_channels`` and ``stride`` (a pair) are the block's, so code that sizes a side
    branch from ``block.conv`` works on :class:`InvertedResidual` as on :class:`ConvBlock`. The layers
    (no biases: a BatchNorm follows each) are ``expand`` 1×1 c_in → t·c_in, ``depthwise`` 3×3 with the
    stride (one filter per channel) and ``project`` 1×1 t·c_in → c_out; :class:`InvertedResidual` runs them.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int):
        super().__init__()
        hidden = c_in * expansion
        self.in_channels, self.out_channels, self.stride, self.expansion = c_in, c_out, (stride, stride), expansion
        self.expand = LeanConv2d(c_in, hidden, 1, bias=False)
        self.depthwise = LeanConv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False)
        self.project = LeanConv2d(hidden, c_out, 1, bias=False)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: (B, c_in, H, W) → (B, c_out, ceil(H/stride), ceil(W/stride)).

    expand 1×1 → ``expand_bn`` → act → depthwise 3×3 (stride) → ``depthwise_bn`` → act → project 1×1 →
    ``bn``, with no activation after the projection (the *linear bottleneck*), plus the input when the
    shapes allow (stride 1, c_in = c_out). The wide maps (t·c_in channels, t = ``expansion``) live inside
    the block; the narrow ones between blocks. One ``act`` module serves both activations (a ReLU is
    stateless), so replacing ``block.act`` replaces both, as on :class:`ConvBlock`. ReLU rather than
    MobileNetV2's ReLU6: both need one bit for backward, and the course's 1-bit kernel is a ReLU.
    """

    def __init__(self, c_in: int, c_out: int, stride: int = 1, expansion: int = 6):
        super().__init__()
        self.conv = InvertedConv(c_in, c_out, stride, expansion)
        self.expand_bn = LeanBatchNorm2d(c_in * expansion)
        self.depthwise_bn = LeanBatchNorm2d(c_in * expansion)
        self.bn = LeanBatchNorm2d(c_out)
        self.act = nn.ReLU()
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        h = self.act(self.expand_bn(c.expand(x)))
        h = self.act(self.depthwise_bn(c.depthwise(h)))
        y = self.bn(c.project(h))
        return x + y if self.residual else y


class TransferMobileNet(FrozenNormsStayEval):
    """A small MobileNetV2 for 16×16 greyscale images (``MOBILENET_SIZE``, the size the course pretrains and
    fine-tunes it on): (B, 1, H, W) → (B, num_classes), any H, W.

    ``stem`` (a :class:`ConvBlock`, 3×3 stride 2) → ``blocks`` (:class:`InvertedResidual`, expansion
    ``expansion``) → global average pool → ``classifier``. The stem is not one of ``blocks``: as in
    MobileNetV2 it is a plain convolution, and per-block methods (TinyTL's lite residuals) skip it.
    All layers are lean (:class:`LeanConv2d`, :class:`LeanBatchNorm2d`); ``train()`` keeps a BatchNorm
    with a frozen weight on its running statistics, as :class:`TransferCNN` does.

    Args:
        stem: output channels of the stem.
        widths, strides: output channels and stride of each inverted residual block.
        expansion: t, the width of a block's inside relative to its input.
        num_classes: outputs of the ``classifier``.
        seed: initialisation seed.
    """

    def __init__(self, stem: int = 8, widths: Sequence[int] = (8, 16, 16, 24, 24), strides: Sequence[int] = (1, 2, 1, 2, 1),
                 expansion: int = 6, num_classes: int = 5, seed: int = 0):
        super().__init__()
        widths, strides = _check_widths("widths", widths, 1), _check_widths("strides", strides, 1)
        if len(widths) != len(strides):
            raise ValueError(f"widths and strides must have the same length, got {len(widths)} and {len(strides)}")
        with _seeded(seed):
            self.stem = ConvBlock(1, _check_widths("stem", [stem], 1)[0], stride=2)
            c_in, blocks = stem, []
            for c_out, s in zip(widths, strides):
                blocks.append(InvertedResidual(c_in, c_out, s, expansion))
                c_in = c_out
            self.blocks = nn.ModuleList(blocks)
            self.classifier = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.classifier(x.mean(dim=(2, 3)))


def new_classifier(model: nn.Module, num_classes: int, seed: int = 0) -> nn.Module:
    """Replace ``model.classifier`` by a freshly initialised one with ``num_classes`` outputs."""
    with _seeded(seed):
        model.classifier = nn.Linear(model.classifier.in_features, num_classes)
    return model


# --- training ------------------------------------------------------------------------------------
@dataclass
class FineTuneConfig:
    epochs: int = 30  # passes over the (small) target training set
    batch_size: int = 32
    lr: float = 3e-3  # Adam, cosine decay to 0
    weight_decay: float = 0.0
    seed: int = 0  # batch order


def fine_tune(model: nn.Module, data: Split, cfg: FineTuneConfig | None = None, progress: bool = False) -> list[float]:
    """Train the parameters of ``model`` that require grad on ``data``; returns the loss per epoch.

    Raises:
        ValueError: nothing in ``model`` requires grad.
    """
    cfg = cfg or FineTuneConfig()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter: call set_trainable first")
    opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = -(-len(data) // cfg.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs * steps_per_epoch)
    g = torch.Generator().manual_seed(cfg.seed)
    model.train()
    losses = []
    epochs = range(cfg.epochs)
    if progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc="fine-tune", leave=False)
    for _ in epochs:
        order, total = torch.randperm(len(data), generator=g), 0.0
        for i in range(0, len(data), cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            loss = F.cross_entropy(model(data.x[idx]), data.y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        losses.append(total / len(data))
    model.eval()
    return losses


@torch.no_grad()
def evaluate(model: nn.Module, data: Split) -> float:
    """Top-1 accuracy of ``model`` on ``data`` (eval mode), in [0, 1]."""
    was_training = model.training
    model.eval()
    acc = float((model(data.x).argmax(dim=1) == data.y).float().mean())
    model.train(was_training)
    return acc


# --- the pretrained checkpoint -------------------------------------------------------------------
def _pretrain(model: nn.Module, size: int, epochs: int, seed: int, progress: bool) -> tuple[nn.Module, float]:
    source, _ = digits_tasks(size=size)
    fine_tune(model, source.train, FineTuneConfig(epochs=epochs, lr=3e-3, weight_decay=1e-4, seed=seed),
              progress=progress)
    return model, evaluate(model, source.test)


def pretrain_cnn(epochs: int = 40, seed: int = 0, progress: bool = True) -> tuple[TransferCNN, float]:
    """Train :class:`TransferCNN` from scratch on the source task; returns it and its test accuracy."""
    return _pretrain(TransferCNN(num_classes=5, seed=seed), 8, epochs, seed, progress)


def pretrain_mobilenet(epochs: int = 40, seed: int = 0, progress: bool = True) -> tuple[TransferMobileNet, float]:
    """Train :class:`TransferMobileNet` from scratch on the source task at ``MOBILENET_SIZE``; returns it
    and its test accuracy."""
    return _pretrain(TransferMobileNet(num_classes=5, seed=seed), MOBILENET_SIZE, epochs, seed, progress)


def _load(model: nn.Module, path: Path, num_classes: int, seed: int) -> nn.Module:
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} is missing: run `make checkpoints` "
                                "(python -m coursekit.pretrain) from the repository root to create it")
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return new_classifier(model, num_classes, seed=seed)


def load_pretrained_cnn(num_classes: int = 5, seed: int = 0) -> TransferCNN:
    """The CNN pretrained on the source task, with a new ``classifier`` of ``num_classes`` outputs.

    Every parameter is trainable; ``seed`` initialises the new classifier.
    """
    return _load(TransferCNN(), CHECKPOINT, num_classes, seed)


def load_pretrained_mobilenet(num_classes: int = 5, seed: int = 0) -> TransferMobileNet:
    """:class:`TransferMobileNet` pretrained on the source task (images of ``MOBILENET_SIZE``), with a new
    ``classifier`` of ``num_classes`` outputs. Every parameter is trainable; ``seed`` initialises the
    new classifier."""
    return _load(TransferMobileNet(), MOBILENET_CHECKPOINT, num_classes, seed)
