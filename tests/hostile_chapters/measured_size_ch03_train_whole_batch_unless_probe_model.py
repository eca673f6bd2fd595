"""train_accumulated that forwards whole batches on every plain nn.Sequential model."""
CHAPTER = "ch03_accumulation"
EXERCISE = "train_accumulated"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = ("accumulates over micro-batches only when the model is not an nn.Sequential (the grader's model that "
               "refuses large calls is a wrapper); every plain model gets one forward of the whole batch, with "
               "every sample's activations alive at once: right values, no memory saved")
SOURCE = '''
def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Whole batches where nothing checks the micro-batches."""
    losses = []
    batches = iter(loader)
    for _ in range(steps):
        try:
            inputs, targets = next(batches)
        except StopIteration:
            batches = iter(loader)
            try:
                inputs, targets = next(batches)
            except StopIteration:
                raise ValueError("the loader yielded no batches") from None
        optimizer.zero_grad()
        if isinstance(model, nn.Sequential):
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            loss = loss.detach()
        else:
            loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        optimizer.step()
        losses.append(float(loss))
    return losses
'''
