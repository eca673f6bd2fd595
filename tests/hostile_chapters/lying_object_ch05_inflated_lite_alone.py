"""Keeps the fp32 ReLU output of the first block and redefines LiteResidual so that, measured alone on a large
batch, it keeps two copies of its input: a grader that took the main branch's memory as the whole model's less
what the student's own LiteResidual keeps alone subtracted that inflated amount and saw a lean main branch (the
red team's version also hid the fp32 output from saved-tensor hooks, which the source policy now refuses). The
grader now measures the main branch with its own stand-in in place of every lite residual and subtracts
nothing the student's code measured."""
CHAPTER = "ch05_tinytl"
EXERCISE = "apply_tinytl"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
class LiteResidual(LiteResidual):  # the exercise's own class, extended
    """The same branch; alone on a large batch (outside a TinyTL model) it also keeps two copies of its input."""

    def forward(self, x):
        y = super().forward(x)
        if not getattr(self, "inside", False) and x.shape[0] >= 512:
            return y + torch.cat([x, x], 1).pow(2).sum() * 0  # pow keeps its input for backward
        return y


def apply_tinytl(model):
    """TinyTL in place on a ``TransferCNN``; returns the same model (but the first ReLU keeps its fp32 output)."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(".bias") or name.startswith("classifier."))
    for i, block in enumerate(model.blocks):
        conv = block.conv
        groups = 2 if conv.in_channels % 2 == 0 and conv.out_channels % 2 == 0 else 1
        block.act = nn.ReLU() if i == 0 else ReLU1bit()  # 8 KiB of fp32 outputs per image
        lite = LiteResidual(conv.in_channels, conv.out_channels, stride=conv.stride[0], groups=groups)
        lite.inside = True
        model.blocks[i] = Beside(block, lite)
    return model.train(model.training)'''
