"""Builds the whole graph under its own saved_tensors_hooks pair and keeps it on ctx, replays the layers under no_grad in backward so that the recomputation order looks right, then differentiates the kept graph: every activation stays in memory."""
CHAPTER = 'ch02_checkpointing'
EXERCISE = 'checkpoint'
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = """\
def checkpoint(function, *args):
    params = list(function.parameters()) if isinstance(function, nn.Module) else []
    n = len(args)

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.inputs = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                          for a in inputs[:n]]
            ctx.rng = torch.get_rng_state()
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                ctx.out = function(*ctx.inputs)
            return ctx.out.detach()

        @staticmethod
        def backward(ctx, grad):
            with torch.no_grad():
                state = torch.get_rng_state()
                torch.set_rng_state(ctx.rng)
                function(*ctx.inputs)
                torch.set_rng_state(state)
            wanted = [a for a in ctx.inputs if isinstance(a, torch.Tensor) and a.requires_grad] + params
            grads = iter(torch.autograd.grad(ctx.out, wanted, grad, allow_unused=True))
            out = [next(grads) if isinstance(a, torch.Tensor) and a.requires_grad else None for a in ctx.inputs]
            return tuple(out) + tuple(next(grads) for _ in params)

    return Keep.apply(*args, *params)
"""
