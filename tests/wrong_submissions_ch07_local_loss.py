"""Plausible wrong answers for ch07_local_loss, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch07_local_loss", "similarity_matrix"): '''
def similarity_matrix(h):
    """Wrong: normalises the rows without centring them first (plain cosine similarity)."""
    if h.dim() < 2:
        raise ValueError("h must be a batch")
    if h.dim() == 4 and h.shape[1] > 3 and h.shape[2] * h.shape[3] > 1:
        z = h.flatten(2).std(dim=2)
    else:
        z = h.flatten(1)
    z = z / (1e-8 + z.norm(dim=1, keepdim=True))
    return (z @ z.t()).clamp(-1, 1)
''',
    ("ch07_local_loss", "predsim_loss"): '''
def predsim_loss(h, y, sim_head, pred_head, num_classes, beta=0.99):
    """Wrong: beta weighs the prediction loss instead of the similarity loss."""
    if not 0 <= beta <= 1:
        raise ValueError("beta must be in [0, 1]")
    if y.dim() != 1 or len(y) != len(h):
        raise ValueError("one label per example")
    pred = F.cross_entropy(pred_head(h.flatten(1)), y)
    sim = F.mse_loss(similarity_matrix(sim_head(h)), similarity_matrix(F.one_hot(y, num_classes).to(h.dtype)))
    return beta * pred + (1 - beta) * sim
''',
    ("ch07_local_loss", "local_training_step"): '''
def local_training_step(blocks, heads, optimizers, x, y):
    """Wrong: no detach anywhere; the summed losses are back-propagated once (deep supervision)."""
    if not blocks or not len(blocks) == len(heads) == len(optimizers):
        raise ValueError("one head and one optimizer per block")
    inp, total, losses = x, 0, []
    for block, head in zip(blocks, heads):
        h, out = block(inp)
        loss = head(h, y)
        total = total + loss
        losses.append(loss.item())
        inp = out
    for opt in optimizers:
        opt.zero_grad()
    total.backward()
    for opt in optimizers:
        opt.step()
    return losses
''',
    ("ch07_local_loss", "bp_schedule"): '''
def bp_schedule(fwd, bwd, n_batches):
    """Wrong: off by one, block k's backward waits bwd[k] after block k + 1's backward starts."""
    if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1:
        raise ValueError("n_batches must be a positive integer")
    if len(fwd) != len(bwd) or not fwd or min(*fwd, *bwd) <= 0:
        raise ValueError("need positive durations, one pair per block")
    K = len(fwd)
    F_ = [[0] * n_batches for _ in range(K)]
    B_ = [[0] * n_batches for _ in range(K)]
    for t in range(n_batches):
        for k in range(K):
            ready = [F_[k - 1][t] + fwd[k - 1]] if k else []
            if t:
                ready.append(B_[k][t - 1] + bwd[k])
            F_[k][t] = max(ready) if ready else 0
        B_[K - 1][t] = F_[K - 1][t] + fwd[K - 1]
        for k in range(K - 2, -1, -1):
            B_[k][t] = B_[k + 1][t] + bwd[k]
    return F_, B_
''',
    ("ch07_local_loss", "dgl_schedule"): '''
def dgl_schedule(fwd, bwd, n_batches):
    """Wrong: block k waits for block k - 1's local backward, as if the output were sent after the update."""
    if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1:
        raise ValueError("n_batches must be a positive integer")
    if len(fwd) != len(bwd) or not fwd or min(*fwd, *bwd) <= 0:
        raise ValueError("need positive durations, one pair per block")
    K = len(fwd)
    F_ = [[0] * n_batches for _ in range(K)]
    for k in range(K):
        for t in range(n_batches):
            ready = [F_[k][t - 1] + fwd[k] + bwd[k]] if t else []
            if k:
                ready.append(F_[k - 1][t] + fwd[k - 1] + bwd[k - 1])
            F_[k][t] = max(ready) if ready else 0
    return F_, [[F_[k][t] + fwd[k] for t in range(n_batches)] for k in range(K)]
''',
}

# A plausible wrong answer that loses only local_training_step's memory cell (test_local_training_step_memory, read
# from outside the student's process): detached between blocks, so every block learns from its own loss only and
# the updates and losses are the method's, but every block's graph is kept and the summed local losses are
# back-propagated once at the end: backprop's peak memory. Graded through the sandbox by
# tests/test_hidden_ch07_local_loss.py.
MEMORY_WRONG = {
    ("ch07_local_loss", "local_training_step"): '''
def local_training_step(blocks, heads, optimizers, x, y):
    """Wrong: detached between blocks, but one backward of the summed local losses at the end keeps every block's
    graph alive until then (test_local_training_step_memory)."""
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
''',
}

# Wrong in the same property, and only on some sizes: the local loop only where the memory cell once drew its sizes
# (K >= 8 blocks and a batch >= 2048), one summed backward at the end everywhere else. The memory cell grades two
# cases with sizes drawn at grading time, one of 5 to 7 blocks, so it loses that cell on every draw (and only it).
SIZE_SWITCH_WRONG = {
    ("ch07_local_loss", "local_training_step"): '''
def local_training_step(blocks, heads, optimizers, x, y):
    """Wrong: frees each block's graph right after its backward only on K >= 8 blocks and a batch >= 2048; on every
    other input one backward of the summed local losses at the end keeps every block's graph alive until then."""
    if not len(blocks) == len(heads) == len(optimizers) or not blocks:
        raise ValueError("one head and one optimizer per block")
    inp, total, losses = x.detach(), 0, []
    local = len(blocks) >= 8 and x.shape[0] >= 2048
    for block, head, optimizer in zip(blocks, heads, optimizers):
        h, out = block(inp)
        loss = head(h, y)
        losses.append(loss.item())
        if local:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            total = total + loss
        inp = out.detach()
    if not local:
        for optimizer in optimizers:
            optimizer.zero_grad()
        total.backward()
        for optimizer in optimizers:
            optimizer.step()
    return losses
''',
}
