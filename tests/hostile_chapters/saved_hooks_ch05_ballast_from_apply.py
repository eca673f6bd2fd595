"""Keeps each block's fp32 ReLU output on large batches and covers it with a 16 MiB buffer that apply_tinytl
allocates on every call and the model frees during its first large forward: memory the student's code
keeps between the check's start and the measured call is capped (3 MiB), so the buffer cannot stand in for
what the call keeps."""
CHAPTER = "ch05_tinytl"
EXERCISE = "apply_tinytl"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = []


class MaybeLean(nn.Module):
    """relu_packed on small batches; on large ones, a plain fp32 ReLU, once the buffer is let go."""

    def forward(self, x):
        if x.shape[0] >= 256:
            BALLAST.clear()
            return torch.relu(x)
        return relu_packed(x)


def apply_tinytl(model):
    """TinyTL in place on a ``TransferCNN``; returns the same model (with a buffer held beside it)."""
    BALLAST.append(torch.ones(4 * 1024 * 1024))  # 16 MiB, allocated after the grader's first reading
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(".bias") or name.startswith("classifier."))
    for i, block in enumerate(model.blocks):
        conv = block.conv
        groups = 2 if conv.in_channels % 2 == 0 and conv.out_channels % 2 == 0 else 1
        block.act = MaybeLean()
        lite = LiteResidual(conv.in_channels, conv.out_channels, stride=conv.stride[0], groups=groups)
        model.blocks[i] = Beside(block, lite)
    return model.train(model.training)'''
