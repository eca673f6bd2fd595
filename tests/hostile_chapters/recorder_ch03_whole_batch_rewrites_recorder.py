"""Forwards the whole batch once and rewrites the batch sizes a recording wrapper kept."""
CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "recorder"
EXPECT = "loses"
DESCRIPTION = ("one forward of the whole batch (no memory saved), micro-batch losses taken from slices of its "
               "output, then any list of recorded batch sizes on the model is rewritten to look like micro-batches")
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """Whole batch in one forward; the recorded sizes are edited afterwards."""
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    lists = [getattr(m, "sizes") for m in model.modules() if isinstance(getattr(m, "sizes", None), list)]
    marks = [len(sizes) for sizes in lists]
    n = inputs.shape[0]
    out = model(inputs)
    total = torch.zeros(())
    for a in range(0, n, micro_batch_size):
        loss = loss_fn(out[a:a + micro_batch_size], targets[a:a + micro_batch_size]) * (len(targets[a:a + micro_batch_size]) / n)
        loss.backward(retain_graph=True)
        total = total + loss.detach()
    for sizes, mark in zip(lists, marks):  # what a recording wrapper saw, rewritten as micro-batches
        sizes[mark:] = [min(micro_batch_size, n - a) for a in range(0, n, micro_batch_size)]
    return total
'''
