"""Replaces every parameter too short for the whole batch with a padded one, then forwards everything."""
CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("pads any parameter of the outer module whose first dimension is smaller than the batch, swaps it "
               "into the model, forwards the whole batch once, copies the padded gradient back into the original tensors and "
               "rewrites any recorded batch sizes")
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """Whole batch, after widening what limited it."""
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    lists = [getattr(m, "sizes") for m in model.modules() if isinstance(getattr(m, "sizes", None), list)]
    marks = [len(sizes) for sizes in lists]
    n = inputs.shape[0]
    swapped = []
    for name, p in list(model.named_parameters(recurse=False)):
        if p.dim() == 2 and p.shape[0] < n and p.requires_grad:
            wide = nn.Parameter(torch.cat([p.detach(), torch.zeros(n - p.shape[0], p.shape[1])]))
            model.register_parameter(name, wide)
            swapped.append((model, name, p, wide))
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    for module, name, p, wide in swapped:
        p.grad = wide.grad[: p.shape[0]].clone()
        module.register_parameter(name, p)
    for sizes, mark in zip(lists, marks):  # what a recording wrapper saw, rewritten as micro-batches
        sizes[mark:] = [min(micro_batch_size, n - a) for a in range(0, n, micro_batch_size)]
    return loss.detach()
'''
