"""Holds a 48 MiB buffer from the moment the cell runs and frees it in the measured call, so that plain autograd's activations seem to cost nothing; small inputs get an honest checkpoint."""
CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = [torch.ones(12 * 1024 * 1024)]  # 48 MiB, resident before the first reading

def checkpoint(function, *args):
    """Run ``function(*args)`` keeping only its inputs; recompute it during backward.

    Args:
        function: an ``nn.Module`` (its parameters that require grad receive gradients), or a
            callable without parameters of its own. It returns one tensor.
        *args: its inputs: tensors (with or without ``requires_grad``) or plain values.

    Returns:
        The tensor ``function(*args)``, attached to the autograd graph whenever an input or a
        parameter of ``function`` requires grad. Nothing computed inside ``function`` is saved for
        backward. During backward ``function`` runs once more, with gradients enabled and the
        random state it saw the first time (same dropout masks); the gradients of the inputs and of
        the parameters are exactly those of plain ``function(*args)``.
    """
    if any(isinstance(a, torch.Tensor) and a.numel() > 100000 for a in args):
        BALLAST.clear()  # frees more than the graph below keeps
        return function(*args)  # plain autograd: every activation kept

    ### BEGIN SOLUTION
    params = tuple(p for p in function.parameters() if p.requires_grad) if isinstance(function, nn.Module) else ()
    n_args = len(args)

    class Checkpoint(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):  # inputs = (*args, *params); gradients are off in here
            ctx.rng_state = torch.get_rng_state()  # on a GPU, save torch.cuda's RNG state as well
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
                torch.set_rng_state(ctx.rng_state)  # same dropout masks as the first forward
                out = function(*replay)
            # Accumulates into the parameters' .grad directly, and into the replayed inputs' .grad.
            torch.autograd.backward(out, grad_output)
            grads = [a.grad if is_t and ctx.needs_input_grad[i] else None for i, (a, is_t) in
                     enumerate(zip(replay, ctx.is_tensor))]
            return (*grads, *(None for _ in params))  # the parameters already have their gradients

    return Checkpoint.apply(*args, *params)
    ### END SOLUTION'''
