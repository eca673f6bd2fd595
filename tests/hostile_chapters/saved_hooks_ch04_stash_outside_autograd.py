CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "saved_hooks"
EXPECT = "breach"
CONSTRUCT = "saved_tensors_hooks"
DESCRIPTION = """Saves the whole fp32 output, under saved-tensor hooks of its own that stash it in a
closure and hand autograd a tiny placeholder, so the grader's hooks never see it."""
SOURCE = '''
def relu_1bit(x):
    """ReLU whose backward keeps one bit per element."""
    stash = []

    def pack(t):
        stash.append(t)
        return len(stash) - 1

    def unpack(i):
        return stash[i]

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            out = inp.clamp_min(0)
            ctx.save_for_backward(out)  # the fp32 output: 32 times the allowed bytes
            return out

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.saved_tensors[0].gt(0)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return Plain.apply(x)
'''
