"""Second correct answers for ch05_tinytl, written from the released notebook alone: table-driven argument checks, a small shape helper, and a name-walking freeze that wraps each block by its index."""

SECOND = {
    ("ch05_tinytl", "LiteResidual"): '''
import torch
import torch.nn.functional as F
from torch import nn


class LiteResidual(nn.Module):
    """TinyTL lite residual: pool -> group conv -> BN -> ReLU -> 1x1 conv -> BN(gamma=0) -> bilinear up."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, downsample: int = 2,
                 groups: int = 2, kernel_size: int = 5):
        super().__init__()
        at_least_one = {"in_channels": in_channels, "out_channels": out_channels, "stride": stride,
                        "downsample": downsample, "kernel_size": kernel_size, "groups": groups}
        for label, value in at_least_one.items():
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        for label, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
            if channels % groups:
                raise ValueError(f"groups={groups} does not divide {label}={channels}")
        self.stride = stride
        self.downsample = downsample
        # registered in this order: conv, norm, pointwise, final_norm
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2,
                              groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.final_norm = nn.BatchNorm2d(out_channels)
        with torch.no_grad():
            self.final_norm.weight.zero_()
            self.final_norm.bias.zero_()

    def _target_size(self, height, width):
        return (height + self.stride - 1) // self.stride, (width + self.stride - 1) // self.stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = self._target_size(x.shape[-2], x.shape[-1])
        small = avg_pool_lean(x, self.downsample)
        small = F.relu(self.norm(self.conv(small)))
        small = self.final_norm(self.pointwise(small))
        return F.interpolate(small, size=size, mode="bilinear", align_corners=False)
''',
    ("ch05_tinytl", "apply_tinytl"): '''
from torch import nn


def apply_tinytl(model):
    """Frozen weights, trained biases + classifier, a lite residual beside each block, 1-bit ReLUs."""
    was_training = model.training
    # 1. the original network: only biases and the classifier keep learning
    for name, param in model.named_parameters():
        keep = name.split(".")[-1] == "bias" or name.split(".")[0] == "classifier"
        param.requires_grad_(keep)
    # 2. each block: a 1-bit ReLU inside, a lite residual beside it
    for index in range(len(model.blocks)):
        block = model.blocks[index]
        conv = block.conv
        c_in, c_out = conv.in_channels, conv.out_channels
        n_groups = 1
        if c_in % 2 == 0 and c_out % 2 == 0:
            n_groups = 2
        block.act = ReLU1bit()
        side = LiteResidual(c_in, c_out, stride=conv.stride[0], groups=n_groups)
        model.blocks[index] = Beside(block, side)
    # 3. re-apply the mode: frozen BatchNorms go back to their running statistics
    model.train(was_training)
    return model
''',
}
