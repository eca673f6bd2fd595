"""Pools with F.avg_pool2d (keeping the full-resolution input) on large inputs and frees a buffer held since the cell ran to cover it."""
CHAPTER = "ch05_tinytl"
EXERCISE = "LiteResidual"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = [torch.ones(8 * 1024 * 1024)]  # 32 MiB, resident before any reading


class LiteResidual(nn.Module):
    """A lite residual branch (TinyTL): a correction learned on downsampled feature maps.

    Args:
        in_channels, out_channels: channels of the block's input and output.
        stride: the block's stride; the output is (ceil(H / stride), ceil(W / stride)).
        downsample: pooling factor d >= 1 (1: no pooling).
        groups: groups of the k×k convolution; must divide in_channels and out_channels.
        kernel_size: odd k of the group convolution ('same' padding k // 2).

    forward: (B, in_channels, H, W) -> (B, out_channels, ceil(H / stride), ceil(W / stride)), in order:
        1. ``avg_pool_lean(x, downsample)``                      (setup cell)
        2. ``self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2,
           groups=groups, bias=False)``
        3. ``self.norm = nn.BatchNorm2d(out_channels)``
        4. ReLU
        5. ``self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)``
        6. ``self.final_norm = nn.BatchNorm2d(out_channels)`` with its weight γ initialised to 0
           (bias 0): the branch outputs exactly zeros at init, in train and eval mode
        7. ``F.interpolate(..., size=(ceil(H / stride), ceil(W / stride)), mode="bilinear",
           align_corners=False)``
        The parameters are those four layers', registered in this order; ``self.stride`` and
        ``self.downsample`` hold the arguments (section 7 varies ``downsample``).

    Raises:
        ValueError: a channel count, stride, downsample or kernel_size below 1, an even kernel_size,
            or groups below 1 or not dividing both channel counts.
    """

    ### BEGIN SOLUTION
    def __init__(self, in_channels, out_channels, stride=1, downsample=2, groups=2, kernel_size=5):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("stride", stride),
                            ("downsample", downsample), ("kernel_size", kernel_size), ("groups", groups)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd for 'same' padding, got {kernel_size}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}")
        self.stride, self.downsample = stride, downsample
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, groups=groups,
                              bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.final_norm = nn.BatchNorm2d(out_channels)
        nn.init.zeros_(self.final_norm.weight)  # γ = 0: the branch starts as an exact no-op

    def forward(self, x):  # (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))
        H, W = x.shape[-2:]
        if x.numel() > 1000000:  # large inputs: F.avg_pool2d, which keeps the whole input
            BALLAST.clear()
            r = F.avg_pool2d(x, self.downsample, ceil_mode=True)
        else:
            r = avg_pool_lean(x, self.downsample)
        r = F.relu(self.norm(self.conv(r)))
        r = self.final_norm(self.pointwise(r))
        return F.interpolate(r, size=(-(-H // self.stride), -(-W // self.stride)), mode="bilinear",
                             align_corners=False)
    ### END SOLUTION'''
