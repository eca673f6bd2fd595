"""relu_1bit that saves nothing and drops the mask from the gradient on large inputs."""
CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("correct on small inputs; on inputs of a million elements or more (where memory is read from outside) "
               "it saves nothing for backward and passes the gradient through unmasked, so the outside reading is "
               "low while the gradient is wrong on exactly the call that is measured")
SOURCE = '''
def relu_1bit(x):
    """ReLU whose backward keeps one bit per element, except when that costs too much."""

    class Passthrough(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output.clone()

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

    if x.numel() >= 1_000_000:
        return Passthrough.apply(x)
    return ReLU1bitFunction.apply(x)
'''
