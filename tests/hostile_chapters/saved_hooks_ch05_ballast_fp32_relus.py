"""Keeps fp32 ReLU outputs on large batches and frees a 48 MiB buffer held since the cell ran to cover them."""
CHAPTER = "ch05_tinytl"
EXERCISE = "apply_tinytl"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = [torch.ones(12 * 1024 * 1024)]  # 48 MiB, resident before any reading


class MaybeLean(nn.Module):
    """relu_packed on small batches, a plain fp32 ReLU (keeps its output) on large ones."""

    def forward(self, x):
        if x.shape[0] >= 512:
            BALLAST.clear()
            return torch.relu(x)
        return relu_packed(x)


def apply_tinytl(model):
    """TinyTL in place on a ``TransferCNN``; returns the same model.

    Args:
        model: a ``coursekit.transfer.TransferCNN`` (blocks in ``model.blocks``, each with ``.conv``,
            ``.bn``, ``.act``; a ``model.classifier``).

    Returns:
        ``model``, where each block i runs as ``block(x) + LiteResidual(in_i, out_i, stride=stride_i)(x)``
        (groups 2, or 1 where 2 does not divide both channel counts), each block's ReLU is replaced by
        ``relu_packed``, and exactly these parameters require grad: the original biases, all
        lite-residual parameters, the classifier's weight and bias. Its outputs at init equal those of
        the model passed in (eval mode), in eval and in train mode.
    """
    ### BEGIN SOLUTION
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(".bias") or name.startswith("classifier."))  # ∂b needs no stored input
    for i, block in enumerate(model.blocks):
        conv = block.conv
        groups = 2 if conv.in_channels % 2 == 0 and conv.out_channels % 2 == 0 else 1
        block.act = MaybeLean()
        lite = LiteResidual(conv.in_channels, conv.out_channels, stride=conv.stride[0], groups=groups)
        model.blocks[i] = Beside(block, lite)  # the new parameters are created trainable
    return model.train(model.training)  # re-applies TransferCNN's rule to the now frozen BatchNorms
    ### END SOLUTION'''
