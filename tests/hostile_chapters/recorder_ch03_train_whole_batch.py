"""train_accumulated that steps on whole-batch gradients and rewrites recorded batch sizes."""
CHAPTER = "ch03_accumulation"
EXERCISE = "train_accumulated"
THREAT = "recorder"
EXPECT = "loses"
DESCRIPTION = ("ignores micro_batch_size and forwards each batch whole, then rewrites any recorded list of "
               "batch sizes on the model")
SOURCE = '''
def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Whole batches; recorded sizes edited."""
    losses, batches = [], list(loader)
    if not batches and steps:
        raise ValueError("the loader yielded no batches")
    seen = []
    for step in range(steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
        n = inputs.shape[0]
        seen += [min(micro_batch_size, n - a) for a in range(0, n, micro_batch_size)]
    for module in model.modules():
        sizes = getattr(module, "sizes", None)
        if isinstance(sizes, list):
            sizes[-len(seen):] = seen
    return losses
'''
