"""Probes of chapter 3 (gradient accumulation): a model that shows which samples went in together,
a batch iterable without ``len``, and a description of a returned value."""
from __future__ import annotations

import torch
from torch import nn


class ch03_MicroBatchModel(nn.Module):
    """Wraps a model and adds ``pos[i]`` to the i-th sample of every forward call: a call on more than
    ``len(pos)`` samples raises, and the gradient of ``pos`` shows which samples went in together."""

    def __init__(self, model: nn.Module, rows: int, features: int, seed: int):
        super().__init__()
        self.model = model
        g = torch.Generator().manual_seed(seed)
        self.pos = nn.Parameter(0.5 * torch.randn(rows, features, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, rows = x.shape[0], self.pos.shape[0]
        if n > rows:
            raise ValueError(f"the model was called on {n} samples at once; it takes at most {rows} per call")
        return self.model(x + self.pos[:n])


def ch03_describe(value) -> dict:
    """What a function returned: its type and, for a tensor, shape, dtype and autograd flags."""
    if isinstance(value, torch.Tensor):
        return {"type": "Tensor", "shape": list(value.shape), "dtype": str(value.dtype),
                "requires_grad": bool(value.requires_grad), "has_grad_fn": value.grad_fn is not None,
                "value": value.detach().clone()}
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return {"type": type(value).__name__, "shape": None, "dtype": None, "requires_grad": None,
            "has_grad_fn": None, "value": number}


class ch03_Batches:
    """A re-iterable of batches with neither ``len`` nor indexing, like a ``DataLoader``: every ``iter()``
    starts a new epoch from the first batch."""

    def __init__(self, batches: list):
        self.batches = list(batches)

    def __iter__(self):
        return iter(list(self.batches))


def ch03_prime() -> None:
    """Prime a worker of this chapter before any student code runs (``grader.sandbox.judge.primes_of``): a model,
    a micro-batch model and SGD optimizers with and without momentum sent as the judge's are (pickled), a few
    accumulated micro-batches and optimizer steps on them, so that the first run's lazily loaded code, copies of
    shared pages and caches are not read as the student's memory by the memory cells."""
    import copy
    import io
    import pickle

    def mlp() -> nn.Sequential:
        return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))

    wrapped = ch03_MicroBatchModel(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 3)),
                                   4, 16, seed=0)
    plain = mlp()
    sent = pickle.load(io.BytesIO(pickle.dumps(
        (plain, torch.optim.SGD(plain.parameters(), lr=0.1), list(plain.parameters()),
         wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9), nn.MSELoss(), nn.CrossEntropyLoss(),
         torch.zeros((), requires_grad=True)))))
    model, opt, _, micro_model, micro_opt, mse, cross_entropy, leaf = sent
    x = torch.randn(10, 16) + leaf.detach()
    for net, optimizer, loss_fn, y in ((model, opt, mse, torch.randn(10, 1)),
                                       (micro_model, micro_opt, cross_entropy, torch.randint(0, 3, (10,))),
                                       (copy.deepcopy(model).double(), None, mse, torch.randn(10, 1))):
        for _ in range(2):
            if optimizer is not None:
                optimizer.zero_grad()
            total = torch.zeros(())
            for a in range(0, 10, 4):
                xb = x[a:a + 4].to(next(net.parameters()).dtype)
                yb = y[a:a + 4] if y.dtype == torch.long else y[a:a + 4].to(xb.dtype)
                loss = loss_fn(net(xb), yb) * (xb.shape[0] / 10)
                loss.backward()
                total = total + loss.detach().float()
            if optimizer is not None:
                optimizer.step()
            float(total)
