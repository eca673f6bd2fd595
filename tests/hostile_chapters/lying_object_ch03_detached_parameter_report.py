"""Forwards the whole batch through the inner model and reports full-batch gradients through a
shadowed named_parameters."""
CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("whole batch through the inner model; the outer model's named_parameters/parameters are "
               "shadowed on the instance to report copies whose .grad is that full-batch gradient")
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """Whole batch, with a shadowed parameter listing."""
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    lists = [getattr(m, "sizes") for m in model.modules() if isinstance(getattr(m, "sizes", None), list)]
    marks = [len(sizes) for sizes in lists]
    n = inputs.shape[0]
    inner = next(model.children())
    loss = loss_fn(inner(inputs), targets)
    loss.backward()

    def report(*args, **kwargs):
        for name, p in nn.Module.named_parameters(model):
            q = p.detach().clone().requires_grad_(p.requires_grad)
            q.grad = None if p.grad is None else p.grad.clone()
            yield name, q

    model.named_parameters = report
    model.parameters = lambda *args, **kwargs: (q for _, q in report())
    for sizes, mark in zip(lists, marks):  # what a recording wrapper saw, rewritten as micro-batches
        sizes[mark:] = [min(micro_batch_size, n - a) for a in range(0, n, micro_batch_size)]
    return loss.detach()
'''
