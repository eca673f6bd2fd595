CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "frames"
EXPECT = "breach"
CONSTRUCT = "sys"
DESCRIPTION = """Saves the whole fp32 input (4 bytes an element instead of 1 bit), then walks up the stack
to the trusted probe that measures saved bytes and rewrites its locals."""
SOURCE = '''
import sys


def relu_1bit(x):
    """ReLU whose backward keeps one bit per element."""

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.relu()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (x > 0)

    frame = sys._getframe(1)
    while frame is not None:
        if "saved" in frame.f_locals:
            frame.f_locals["saved"].clear()
        frame = frame.f_back
    return Keep.apply(x)
'''
