"""Plausible wrong answers for chapter 2, one per exercise: each must lose points when autograded, in the
cells of the properties it gets wrong only (named in each docstring)."""

WRONG = {
    ("ch02_checkpointing", "checkpoint"): '''
import torch
from torch import nn

def checkpoint(function, *args):
    """Wrong: recomputes without replaying the RNG state, so dropout masks differ (test_checkpoint_rng)."""
    params = tuple(p for p in function.parameters() if p.requires_grad) if isinstance(function, nn.Module) else ()
    n = len(args)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.save_for_backward(*inputs[:n])
            return function(*inputs[:n])

        @staticmethod
        def backward(ctx, grad):
            xs = [t.detach().requires_grad_(ctx.needs_input_grad[i]) for i, t in enumerate(ctx.saved_tensors)]
            with torch.enable_grad():
                out = function(*xs)
            torch.autograd.backward(out, grad)
            return (*(x.grad if x.requires_grad else None for x in xs), *(None for _ in params))

    return Fn.apply(*args, *params)
''',
    ("ch02_checkpointing", "checkpoint_uniform"): '''
import math
from torch import nn

def checkpoint_uniform(layers, x, segments):
    """Wrong: chunks of ceil(n / k) layers, 10 in 4 gives 3, 3, 3, 1 (test_checkpoint_uniform)."""
    layers = list(layers)
    if not isinstance(segments, int) or not 1 <= segments <= len(layers):
        raise ValueError(f"bad number of segments {segments}")
    size = math.ceil(len(layers) / segments)
    for start in range(0, len(layers), size):
        x = checkpoint(nn.Sequential(*layers[start:start + size]), x)
    return x
''',
    ("ch02_checkpointing", "checkpoint_blocks"): '''
from torch import nn

def checkpoint_blocks(layers, x, block_size):
    """Wrong: the last block runs without checkpoint (test_checkpoint_blocks, and b = 15 in its edge cases)."""
    layers = list(layers)
    if block_size < 1:
        raise ValueError(f"bad block size {block_size}")
    starts = list(range(0, len(layers), block_size))
    for start in starts[:-1]:
        x = checkpoint(nn.Sequential(*layers[start:start + block_size]), x)
    for layer in layers[starts[-1]:]:
        x = layer(x)
    return x
''',
    ("ch02_checkpointing", "plan_checkpoints"): '''
def plan_checkpoints(act_bytes, fwd_flops, budget_bytes):
    """Wrong: greedy, drops the checkpoint that adds the least recomputation until the plan fits
    (test_plan_checkpoints and the long chain)."""
    if len(act_bytes) != len(fwd_flops):
        raise ValueError("one size and one cost per layer")
    plan = list(range(len(act_bytes)))
    while plan_memory(plan, act_bytes) > budget_bytes:
        if len(plan) == 1:
            raise ValueError("no plan fits")
        options = [[c for c in plan if c != d] for d in plan[1:]]
        plan = min(options, key=lambda p: (plan_recompute(p, fwd_flops), plan_memory(p, act_bytes)))
    return plan
''',
}

# Plausible wrong answers that lose only an exercise's memory cell (read from outside the student's process): the
# chunks are right and every value is right, but each layer's output is recorded for a plot in a list that outlives
# the call, so every activation stays alive until the next call. Nothing of it is saved for backward: saved-tensor
# hooks never see it. Graded through the sandbox by tests/test_hidden_ch02_checkpointing.py.
MEMORY_WRONG = {
    ("ch02_checkpointing", "checkpoint_uniform"): '''
from torch import nn

ACTIVATIONS = []  # every layer's output of the last call, to plot them


def checkpoint_uniform(layers, x, segments):
    """Wrong: right chunks, but every layer's output stays in ACTIVATIONS (test_checkpoint_uniform_memory)."""
    layers = list(layers)
    n = len(layers)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= n:
        raise ValueError(f"segments must be an int in 1..{n}, got {segments!r}")
    ACTIVATIONS.clear()
    hooks = [layer.register_forward_hook(lambda module, inputs, output: ACTIVATIONS.append(output))
             for layer in layers]
    size, extra = divmod(n, segments)
    start = 0
    try:
        for i in range(segments):
            stop = start + size + (i < extra)
            x = checkpoint(nn.Sequential(*layers[start:stop]), x)
            start = stop
    finally:
        for hook in hooks:
            hook.remove()
    return x
''',
    ("ch02_checkpointing", "checkpoint_blocks"): '''
from torch import nn


def checkpoint_blocks(layers, x, block_size):
    """Wrong: right blocks, but a copy of every layer's output stays in checkpoint_blocks.log, by layer index
    (test_checkpoint_blocks_memory)."""
    layers = list(layers)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    checkpoint_blocks.log = {}
    hooks = [layer.register_forward_hook(lambda module, inputs, output, i=i: checkpoint_blocks.log.setdefault(
        i, output.detach().clone())) for i, layer in enumerate(layers)]
    try:
        for start in range(0, len(layers), block_size):
            x = checkpoint(nn.Sequential(*layers[start:start + block_size]), x)
    finally:
        for hook in hooks:
            hook.remove()
    return x
''',
}
