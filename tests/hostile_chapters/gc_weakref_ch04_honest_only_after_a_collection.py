"""relu_1bit keeps an fp32 copy of x except in a call that follows a garbage collection, seen without any code the
collector runs: a hook handle holds only a weak reference to its table (``RemovableHandle.hooks_dict_ref``), and a
table kept alive by a reference cycle alone is gone once the collector has run. The policy refuses the weak
reference."""
CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "gc_finalizer"
EXPECT = "breach"
CONSTRUCT = "hooks_dict_ref"
DESCRIPTION = __doc__
SOURCE = '''\
_PROBE = [None]


def _arm():
    table = {}
    table["self"] = table  # alive through its own cycle only, until the collector runs
    _PROBE[0] = torch.utils.hooks.RemovableHandle(table)  # holds a weak reference to the table


def _collected():
    gone = _PROBE[0].hooks_dict_ref() is None
    _arm()
    return gone


def relu_1bit(x):
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.save_for_backward(inp.detach().clone())
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            (saved,) = ctx.saved_tensors
            return grad_output.masked_fill(~(saved > 0), 0)

    class Packed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.shape = inp.shape
            ctx.save_for_backward(pack_bits(inp > 0))
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            (packed,) = ctx.saved_tensors
            keep = unpack_bits(packed, grad_output.numel()).reshape(ctx.shape)
            return grad_output.masked_fill(~keep, 0)

    return (Packed if _collected() else Copy).apply(x)


_arm()
'''
