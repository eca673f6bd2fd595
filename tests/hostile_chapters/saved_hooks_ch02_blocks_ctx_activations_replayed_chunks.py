"""Every layer's input kept as ctx attributes (saved-tensor hooks never see them), with the block order
replayed in backward: each chunk, the last first, runs again from its stored input under torch.enable_grad() and is
back-propagated, so the values are plain autograd's bit for bit, the forward pass calls each layer once and the
layers that run again during backward form the expected chunks. The in-process traces all look right; the worker's
cgroup shows every layer's input held between forward and backward: it must lose test_checkpoint_blocks_memory."""
CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint_blocks"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def checkpoint_blocks(layers, x, arg):
    layers = list(layers)
    n = len(layers)
    if isinstance(arg, bool) or not isinstance(arg, int) or arg < 1:
        raise ValueError(f"block_size must be a positive int, got {arg!r}")
    bounds = [(s, min(s + arg, n)) for s in range(0, n, arg)]
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
