"""Holds a 96 MiB buffer from the moment the cell runs and frees it on large inputs, where it returns torch.relu(x), which keeps the fp32 output."""
CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = [torch.ones(24 * 1024 * 1024)]  # 96 MiB

def relu_1bit(x):
    """ReLU whose backward keeps only a packed sign mask.

    Args:
        x: a floating-point tensor of any shape (n elements).

    Returns:
        ``torch.relu(x)`` (same shape and dtype). For backward, exactly one tensor is saved with
        ``ctx.save_for_backward``: ``pack_bits(x > 0)``, ``ceil(n / 8)`` bytes; the gradient is
        that of ``torch.relu`` (``grad * (x > 0)``, so 0 where ``x == 0``).
    """
    if x.numel() > 100000:
        BALLAST.clear()
        return torch.relu(x)  # keeps the full float32 output for backward

    ### BEGIN SOLUTION
    class ReLU1bitFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.shape = inp.shape
            ctx.save_for_backward(pack_bits(inp > 0))
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            (packed,) = ctx.saved_tensors
            positive = unpack_bits(packed, grad_output.numel()).reshape(ctx.shape)
            return grad_output.masked_fill(~positive, 0)

    return ReLU1bitFunction.apply(x)
    ### END SOLUTION'''
