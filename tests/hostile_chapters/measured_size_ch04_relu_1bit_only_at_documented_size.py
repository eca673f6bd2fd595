"""relu_1bit that keeps the packed mask only at the one documented measured size (2^24 elements)."""
CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = ("saves the packed mask with ctx.save_for_backward, as the saved-bytes probe expects, but on every "
               "input except 2^24 elements also keeps an fp32 copy of the input as a ctx attribute and computes "
               "the gradient from it (4 bytes an element instead of 1/8): correct memory only where the text said "
               "memory is read from outside")
SOURCE = '''
def relu_1bit(x):
    """ReLU whose backward keeps one bit per element (when measured)."""

    class ReLU1bitFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.shape = inp.shape
            ctx.save_for_backward(pack_bits(inp > 0))
            if inp.numel() != 1 << 24:
                ctx.spare = inp.detach().clone()
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            spare = getattr(ctx, "spare", None)
            if spare is not None:
                return grad_output * (spare > 0)
            (packed,) = ctx.saved_tensors
            positive = unpack_bits(packed, grad_output.numel()).reshape(ctx.shape)
            return grad_output.masked_fill(~positive, 0)

    return ReLU1bitFunction.apply(x)
'''
