"""Plausible wrong answers for ch00_memory, one per exercise: each must lose points when autograded.

predict_training_memory keeps one Adam moment instead of two (optimizer state) and counts only the
Linear outputs as activations (it forgets the input, the ReLU outputs and the target)."""

WRONG = {
    ("ch00_memory", "predict_training_memory"): '''
import torch
from torch import nn

def predict_training_memory(model, batch_size, optimizer):
    """Wrong: Adam keeps one copy instead of two, and activations count only Linear outputs."""
    copies = {"sgd": 0, "momentum": 1, "adam": 1}[optimizer]
    params = sum(p.numel() * 4 for p in model.parameters())
    acts = sum(batch_size * m.out_features * 4 for m in model if isinstance(m, nn.Linear))
    return {"params": params, "grads": params, "optimizer_state": copies * params, "activations": acts}
''',
}
