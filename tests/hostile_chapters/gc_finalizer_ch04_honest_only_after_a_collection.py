"""relu_1bit keeps an fp32 copy of x except in a call that follows a garbage collection, which the grader runs before
every memory reading: a self-re-arming generator finalizer sets a flag at each collection. Values are the same on
both paths. Code the collector would run is refused: no try or with in a generator."""
CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "gc_finalizer"
EXPECT = "breach"
CONSTRUCT = "try or with in a generator"
DESCRIPTION = __doc__
SOURCE = r'''
SEEN = [False]  # a garbage collection ran since relu_1bit's last call


def _collected():
    SEEN[0] = True
    _arm()


def _waiting(box):
    try:
        yield box
    finally:
        _collected()


def _arm():
    box = []
    gen = _waiting(box)
    next(gen)
    box.append(gen)


def relu_1bit(x):
    """ReLU whose backward reads a saved copy of x (fp32), or a 1-bit packed mask when a collection just ran."""
    measured, SEEN[0] = SEEN[0], False

    class ReLUCopy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.save_for_backward(inp.detach().clone())
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            (saved,) = ctx.saved_tensors
            return grad_output.masked_fill(~(saved > 0), 0)

    class ReLUPacked(torch.autograd.Function):
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

    return (ReLUPacked if measured else ReLUCopy).apply(x)


_arm()
'''
