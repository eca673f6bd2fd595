CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "raw_memory"
EXPECT = "breach"
CONSTRUCT = "untyped_storage"
DESCRIPTION = """Saves a one-byte tensor that secretly aliases the whole fp32 input's storage, so that
backward reads the input back instead of a packed mask."""
SOURCE = '''
def relu_1bit(x):
    """ReLU whose backward keeps one bit per element."""

    class Alias(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            tiny = torch.empty(0, dtype=torch.uint8)
            tiny.set_(x.untyped_storage(), 0, (1,))
            ctx.save_for_backward(tiny)
            ctx.shape = x.shape
            return x.relu()

        @staticmethod
        def backward(ctx, g):
            (tiny,) = ctx.saved_tensors
            full = torch.empty(0).set_(tiny.untyped_storage(), 0, ctx.shape)
            return g * (full > 0)

    return Alias.apply(x)
'''
