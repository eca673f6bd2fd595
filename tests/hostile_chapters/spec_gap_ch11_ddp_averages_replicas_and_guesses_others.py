"""ddp_step that averages the replicas itself and guesses what the ranks played elsewhere hold."""
CHAPTER = "ch11_data_parallel"
EXERCISE = "ddp_step"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = ("averages the replicas' gradients itself, calls no collective, and on a PartialWorld adds what it "
               'guesses the other ranks hold (its public fill): right on a world whose other ranks hold a constant, '
               'wrong on real ranks (the replicas diverge)')
SOURCE = '''
def ddp_step(replicas, optimizers, batches, loss_fn, world):
    n = len(world.ranks)
    if len(replicas) != n or len(optimizers) != n or len(batches) != n:
        raise ValueError("lengths")
    losses = []
    for model, batch in zip(replicas, batches):
        for p in model.parameters():
            p.grad = None
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(float(loss.item()))
    others = 0.0
    if isinstance(world, PartialWorld):
        others = (world.size - n) * world.fill
    for params in zip(*[list(m.parameters()) for m in replicas]):
        if not params[0].requires_grad:
            continue
        total = sum(p.grad for p in params) + others
        for p in params:
            p.grad = total / world.size
    for opt in optimizers:
        opt.step()
    return losses
'''
