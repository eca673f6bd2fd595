CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "raw_memory"
EXPECT = "breach"
CONSTRUCT = "ctypes"
DESCRIPTION = """Saves a bool mask (8 times the allowed bytes) and shrinks the saved tensor's size
field in place through numpy's raw-memory view of the tensor object."""
SOURCE = '''
import numpy as np


def relu_1bit(x):
    """ReLU whose backward keeps one bit per element."""

    class ByteMask(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.save_for_backward(inp > 0)  # a byte per element, eight times the allowed size
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.saved_tensors[0]

    y = ByteMask.apply(x)
    header = np.ctypeslib.as_array(np.zeros(1).ctypes.data_as(np.ctypeslib.ctypes.POINTER(np.ctypeslib.ctypes.c_int64)),
                                   (64,))
    header[:] = 0
    return y
'''
