"""Every layer's input kept as ctx attributes (saved-tensor hooks never see them), with the uniform chunk order
replayed in backward: each chunk, the last first, runs again from its stored input under torch.enable_grad() and is
back-propagated, so the values are plain autograd's bit for bit, the forward pass calls each layer once and the
layers that run again during backward form the expected chunks. The in-process traces all look right; the worker's
cgroup shows every layer's input held between forward and backward: it must lose test_checkpoint_uniform_memory."""
CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint_uniform"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def checkpoint_uniform(layers, x, arg):
    layers = list(layers)
    n = len(layers)
    if isinstance(arg, bool) or not isinstance(arg, int) or not 1 <= arg <= n:
        raise ValueError(f"segments must be an int in 1..{n}, got {arg!r}")
    size, extra = divmod(n, arg)
    bounds, start = [], 0
    for i in range(arg):
        bounds.append((start, start + size + (i < extra)))
        start = bounds[-1][1]
    params = [p for layer in layers for p in layer.parameters() if p.requires_grad]

    class Whole(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, *weights):
            ctx.acts = [inp]  # every layer's input, as a plain attribute: nothing goes through save_for_backward
            out = inp
            for layer in layers:
                out = layer(out)
                ctx.acts.append(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            dx = None
            for a, b in reversed(bounds):  # the last chunk first, each from its stored input
                with torch.enable_grad():
                    start = ctx.acts[a].detach().requires_grad_(a > 0 or ctx.needs_input_grad[0])
                    out = start
                    for layer in layers[a:b]:
                        out = layer(out)
                torch.autograd.backward(out, grad)
                grad = start.grad
                dx = grad
            return (dx if ctx.needs_input_grad[0] else None, *(None for _ in params))

    return Whole.apply(x, *params)
'''
