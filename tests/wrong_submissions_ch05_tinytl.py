"""Plausible wrong answers for chapter 5, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch05_tinytl", "LiteResidual"): '''
import math
import torch
import torch.nn.functional as F
from torch import nn

class LiteResidual(nn.Module):
    """Wrong: the final norm keeps its default weight 1, so the branch is not zero at init."""
    def __init__(self, in_channels, out_channels, stride=1, downsample=2, groups=2, kernel_size=5):
        super().__init__()
        if downsample < 1 or stride < 1 or kernel_size % 2 == 0 or in_channels % groups or out_channels % groups:
            raise ValueError("bad arguments")
        self.stride, self.downsample = stride, downsample
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.final_norm = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        H, W = x.shape[-2:]
        r = self.final_norm(self.pointwise(F.relu(self.norm(self.conv(avg_pool_lean(x, self.downsample))))))
        return F.interpolate(r, size=(math.ceil(H / self.stride), math.ceil(W / self.stride)), mode="bilinear",
                             align_corners=False)
''',
    ("ch05_tinytl", "apply_tinytl"): '''
def apply_tinytl(model):
    """Wrong: adds the lite residuals and 1-bit ReLUs but leaves every original weight trainable."""
    for i, block in enumerate(model.blocks):
        conv = block.conv
        groups = 2 if conv.in_channels % 2 == 0 and conv.out_channels % 2 == 0 else 1
        block.act = ReLU1bit()
        model.blocks[i] = Beside(block, LiteResidual(conv.in_channels, conv.out_channels, stride=conv.stride[0],
                                                      groups=groups))
    return model
''',
}
