"""Runs the local loop (backward and step per block, one graph at a time) only where the memory cell once drew
its sizes (K >= 8 blocks and a batch >= 2048, the range the docstring published); on every other input it keeps
every block's graph for one backward of the summed local losses at the end: the same updates, backprop's memory.
The memory cell now grades two cases whose sizes are drawn at grading time, one of them with 5 to 7 blocks, so
the step's peak, read from the worker's cgroup, exceeds its bound on every draw: it loses exactly that cell."""
CHAPTER = "ch07_local_loss"
EXERCISE = "local_training_step"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''
def local_training_step(blocks, heads, optimizers, x, y):
    """One local step; memory-efficient only on the sizes the memory cell used to measure."""
    if not len(blocks) == len(heads) == len(optimizers) or not blocks:
        raise ValueError("need one head and one optimizer per block")
    losses = []
    inp = x.detach()
    if len(blocks) >= 8 and x.shape[0] >= 2048:  # the published range: one block's graph at a time
        for block, head, optimizer in zip(blocks, heads, optimizers):
            h, out = block(inp)
            loss = head(h, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            inp = out.detach()
        return losses
    # everywhere else: every block's graph stays alive until one backward at the end
    total = 0
    for block, head, optimizer in zip(blocks, heads, optimizers):
        h, out = block(inp)
        loss = head(h, y)
        losses.append(loss.item())
        total = total + loss
        inp = out.detach()
    for optimizer in optimizers:
        optimizer.zero_grad()
    total.backward()
    for optimizer in optimizers:
        optimizer.step()
    return losses
'''
