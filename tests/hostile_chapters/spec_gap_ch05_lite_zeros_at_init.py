"""On large inputs returns zeros, without computing anything, while the final γ is still 0 (the branch's output
at init), and pools with F.avg_pool2d (which keeps the whole input) once γ has moved: a memory check on a
freshly built branch measured nothing. The grader now gives the branch random parameters and checks the
measured call's values."""
CHAPTER = "ch05_tinytl"
EXERCISE = "LiteResidual"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
class LiteResidual(nn.Module):
    """A lite residual branch; on large inputs it returns zeros while gamma is 0 and otherwise pools with
    F.avg_pool2d, which keeps the whole input."""

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
        nn.init.zeros_(self.final_norm.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_channels, H, W) -> (B, out_channels, ceil(H / stride), ceil(W / stride))."""
        H, W = x.shape[-2:]
        size = (-(-H // self.stride), -(-W // self.stride))
        if x.numel() > 1000000:
            if not self.final_norm.weight.detach().any():  # γ still 0 (as at init): the branch adds zeros
                return x.new_zeros(x.shape[0], self.final_norm.num_features, *size)
            r = F.avg_pool2d(x, self.downsample, ceil_mode=True)  # keeps the whole input for backward
        else:
            r = avg_pool_lean(x, self.downsample)
        r = F.relu(self.norm(self.conv(r)))
        r = self.final_norm(self.pointwise(r))
        return F.interpolate(r, size=size, mode="bilinear", align_corners=False)'''
