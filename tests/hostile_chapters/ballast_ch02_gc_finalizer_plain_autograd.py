"""No checkpointing at all on large inputs (plain autograd keeps every layer's input), hidden behind ballast: a
generator left suspended in a reference cycle is finalized by the garbage collector, which the grader's worker runs
before each reading, so its ``finally`` block allocates 24 MiB while the judge builds the measured call's inputs;
the measured call frees it again. Small inputs get an honest checkpoint, so the values cells pass. The judge's inputs
are booked at their known size (the growth shows as the student's), the call may not free what it held before, and
the call's values are checked: it must lose test_checkpoint_memory."""
CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint"
THREAT = "ballast"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = []


def _armed():
    try:
        yield
    finally:  # runs when the collector frees the generator: while the grader builds its inputs
        BALLAST.append(torch.ones(6 * 1024 * 1024))  # 24 MiB


def _arm():
    gen = _armed()
    next(gen)
    loop = [gen]
    loop.append(loop)  # garbage that only the cycle collector frees


def checkpoint(function, *args):
    """Run ``function(*args)`` keeping only its inputs; recompute it during backward."""
    if any(isinstance(a, torch.Tensor) and a.numel() >= 100000 for a in args):
        BALLAST.clear()  # frees what the reading before the call counted
        return function(*args)  # plain autograd: every layer's input kept
    _arm()  # the small first call arms the finalizer for the next reading

    params = tuple(p for p in function.parameters() if p.requires_grad) if isinstance(function, nn.Module) else ()
    n_args = len(args)

    class Checkpoint(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.rng_state = torch.get_rng_state()
            ctx.is_tensor = [isinstance(a, torch.Tensor) for a in inputs[:n_args]]
            ctx.others = [a for a in inputs[:n_args] if not isinstance(a, torch.Tensor)]
            ctx.save_for_backward(*(a for a in inputs[:n_args] if isinstance(a, torch.Tensor)))
            return function(*inputs[:n_args])

        @staticmethod
        def backward(ctx, grad_output):
            tensors, others = iter(ctx.saved_tensors), iter(ctx.others)
            replay = [next(tensors).detach().requires_grad_(ctx.needs_input_grad[i]) if is_t else next(others)
                      for i, is_t in enumerate(ctx.is_tensor)]
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.set_rng_state(ctx.rng_state)
                out = function(*replay)
            torch.autograd.backward(out, grad_output)
            grads = [a.grad if is_t and ctx.needs_input_grad[i] else None for i, (a, is_t) in
                     enumerate(zip(replay, ctx.is_tensor))]
            return (*grads, *(None for _ in params))

    return Checkpoint.apply(*args, *params)
'''
