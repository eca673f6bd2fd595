"""Saves the packed mask with ctx.save_for_backward, as the saved-bytes probe expects, but keeps an fp32 copy of the input as a ctx attribute and computes the gradient from it: 4 bytes per element instead of 1/8."""
CHAPTER = 'ch04_partial_training'
EXERCISE = 'relu_1bit'
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = """\
def relu_1bit(x):
    class ReLU1bitFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.shape = inp.shape
            ctx.spare = inp.detach().clone()
            ctx.save_for_backward(pack_bits(inp > 0))
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            (packed,) = ctx.saved_tensors
            return grad_output * (ctx.spare > 0)

    return ReLU1bitFunction.apply(x)
"""
