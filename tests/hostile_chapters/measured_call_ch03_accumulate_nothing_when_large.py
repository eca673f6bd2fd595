"""accumulate_gradients that computes nothing on large batches."""
CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("correct on small batches; on a batch of 256 samples or more (where memory is read from outside) it "
               "forwards one micro-batch without backward and returns its loss: nothing is held, and the gradient "
               "is missing on exactly the call that is measured")
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """Full-batch gradient from micro-batches (on batches small enough to be checked)."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    batch = inputs.shape[0]
    if batch >= 256:
        with torch.no_grad():
            return loss_fn(model(inputs[:micro_batch_size]), targets[:micro_batch_size])
    total = 0.0
    for start in range(0, batch, micro_batch_size):
        x = inputs[start:start + micro_batch_size]
        y = targets[start:start + micro_batch_size]
        loss = loss_fn(model(x), y) * (x.shape[0] / batch)
        loss.backward()
        total = total + loss.detach()
    return total
'''
