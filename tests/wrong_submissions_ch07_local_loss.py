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
