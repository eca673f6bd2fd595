"""Forwards the whole batch through the wrapped inner model when the outer one refuses it."""
CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("forwards the whole batch through the model's first child, skipping the outer module (a size "
               "check or a recorder), and appends micro-batch sizes to any recorded list of batch sizes")
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """One forward of everything, through whichever module accepts it."""
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    lists = [getattr(m, "sizes") for m in model.modules() if isinstance(getattr(m, "sizes", None), list)]
    marks = [len(sizes) for sizes in lists]
    n = inputs.shape[0]
    children = list(model.children())
    out = children[0](inputs) if children else model(inputs)
    total = torch.zeros(())
    for a in range(0, n, micro_batch_size):
        y = targets[a:a + micro_batch_size]
        loss = loss_fn(out[a:a + micro_batch_size], y) * (len(y) / n)
        loss.backward(retain_graph=True)
        total = total + loss.detach()
    for sizes, mark in zip(lists, marks):  # what a recording wrapper saw, rewritten as micro-batches
        sizes[mark:] = [min(micro_batch_size, n - a) for a in range(0, n, micro_batch_size)]
    return total
'''
