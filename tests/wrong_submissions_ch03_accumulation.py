"""Plausible wrong answers for ch03_accumulation, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch03_accumulation", "accumulate_gradients"): '''
import torch

def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """Wrong: averages the micro-batch losses with equal weights 1/k, although the last one is smaller."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size}")
    chunks = list(zip(inputs.split(micro_batch_size), targets.split(micro_batch_size)))
    total = torch.zeros(())
    for x, y in chunks:
        loss = loss_fn(model(x), y) / len(chunks)
        loss.backward()
        total += loss.detach()
    return total
''',
    ("ch03_accumulation", "train_accumulated"): '''
def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Wrong: never zeroes the gradients, so they keep adding up across batches."""
    losses = []
    while len(losses) < steps:
        for inputs, targets in loader:
            if len(losses) == steps:
                break
            loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
            optimizer.step()
            losses.append(loss.item())
    return losses
''',
}
