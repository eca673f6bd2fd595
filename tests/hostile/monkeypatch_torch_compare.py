"""Make every tensor comparison succeed: allclose, assert_close, isclose, equal, ==."""
THREAT = "monkeypatch"
DEFENCE = ("Only the worker's torch is patched; the judge compares fetched tensors with its own, "
           "untouched torch and coursekit.")
EXPECT = "differs from the reference"
TRICK = '''\
import torch, torch.testing
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.isclose = lambda a, b, *args, **kwargs: torch.ones_like(torch.as_tensor(a), dtype=torch.bool)
torch.testing.assert_close = lambda *args, **kwargs: None
torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
torch.Tensor.allclose = lambda *args, **kwargs: True
'''
