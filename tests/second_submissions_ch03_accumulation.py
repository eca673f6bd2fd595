"""Second correct answers for ch03_accumulation, written from the released notebook alone: a while loop over slice starts with a per-micro-batch helper, and a generator that restarts the loader."""

SECOND = {
    ('ch03_accumulation', 'accumulate_gradients'): '''
import torch
from torch import nn


def accumulate_gradients(model: nn.Module, loss_fn: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                         micro_batch_size: int) -> torch.Tensor:
    m = micro_batch_size
    if isinstance(m, bool) or not isinstance(m, int) or m <= 0:
        raise ValueError(f"micro_batch_size must be a positive integer, got {m!r}")
    total = len(inputs)
    if total == 0:
        raise ValueError("the batch is empty: there is no mean loss to accumulate")

    def one_micro_batch(start: int) -> torch.Tensor:
        stop = min(start + m, total)
        weight = (stop - start) / total  # n_i / B
        loss = loss_fn(model(inputs[start:stop]), targets[start:stop])
        (loss * weight).backward()  # frees this micro-batch's graph before the next forward
        return loss.detach() * weight

    running = None
    start = 0
    while start < total:
        part = one_micro_batch(start)
        running = part if running is None else running + part
        start += m
    return running
''',
    ('ch03_accumulation', 'train_accumulated'): '''
import torch
from torch import nn


def train_accumulated(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module, loader,
                      micro_batch_size: int, steps: int) -> list[float]:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")

    def endless():
        while True:
            produced = False
            for batch in loader:
                produced = True
                yield batch
            if not produced:
                raise ValueError("the loader is empty: no batch to train on")

    history = []
    if steps == 0:
        return history
    for _, (inputs, targets) in zip(range(steps), endless()):
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        optimizer.step()
        history.append(loss.item())
    return history
''',
}
