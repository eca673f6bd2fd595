"""Hide a missing parameter from the in-process probes by patching what they call."""
THREAT = "monkeypatch"
DEFENCE = ("Before a probe runs in the worker, an integrity check compares every attribute of "
           "torch, coursekit, grader and builtins (and their classes) with the snapshot the fork "
           "server took before student code ran: the patched Module.named_parameters is found and "
           "the problem fails with 'tried to replace ...'.")
EXPECT = "tried to replace"
# The wrong layer keeps its weight as a plain tensor (never trained), and the trick makes
# named_parameters() and the probe's table report it as a trainable parameter anyway.
WRONG = {"ch99_toy": '''\
def scaled_sum(x, alpha):
    return x.sum(dim=-1)


class LinearNoBias(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.register_buffer("weight", torch.randn(out_features, in_features))

    def forward(self, x):
        return x @ self.weight.T
'''}
TRICK = '''\
import torch
from torch import nn
_named_parameters = nn.Module.named_parameters

def named_parameters(self, *args, **kwargs):
    yield from _named_parameters(self, *args, **kwargs)
    for name, buf in self.named_buffers():
        yield name, nn.Parameter(buf)

nn.Module.named_parameters = named_parameters
import sys
probes = sys.modules.get("grader.probes.shared")  # the module that defines param_table
if probes is not None:
    probes.param_table = lambda module: {"weight": {"shape": [29, 53], "requires_grad": True,
                                                    "value": module.weight, "grad": None}}
'''
