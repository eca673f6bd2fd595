"""Detaches between blocks (so every block learns from its own loss only, with the very updates and losses of
the method) but keeps every block's graph and back-propagates the summed local losses once at the end:
backprop's peak memory, the one thing local learning exists to avoid. The memory cell's peak, read from the
worker's cgroup on many wide blocks against the course's own local backward of one block, stops it."""
CHAPTER = "ch07_local_loss"
EXERCISE = "local_training_step"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''
def local_training_step(blocks, heads, optimizers, x, y):
    """Detached between blocks, but every block's graph is kept and the summed local losses are back-propagated
    once at the end: the same updates, backprop's peak memory."""
    if not len(blocks) == len(heads) == len(optimizers) or not blocks:
        raise ValueError("one head and one optimizer per block")
    inp, total, losses = x.detach(), 0, []
    for block, head in zip(blocks, heads):
        h, out = block(inp)
        loss = head(h, y)
        total = total + loss
        losses.append(loss.item())
        inp = out.detach()
    for optimizer in optimizers:
        optimizer.zero_grad()
    total.backward()
    for optimizer in optimizers:
        optimizer.step()
    return losses
'''
