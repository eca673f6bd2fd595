"""Second correct answers for ch00_memory, written from the released notebook alone: a single forward walk over the layer list that marks which tensors of the chain backward keeps, then sums their widths."""

SECOND = {
    ('ch00_memory', 'predict_training_memory'): '''
import torch
from torch import nn


def predict_training_memory(model, batch_size, optimizer):
    copies_per_optimizer = {"sgd": 0, "momentum": 1, "adam": 2}
    if not isinstance(optimizer, str) or optimizer not in copies_per_optimizer:
        raise ValueError(
            f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum' or 'adam'")

    def flatten(module):
        # the layers in the order the forward pass runs them
        for child in module.children():
            if isinstance(child, nn.Sequential):
                yield from flatten(child)
            else:
                yield child

    layers = list(flatten(model))
    linears = [layer for layer in layers if isinstance(layer, nn.Linear)]
    if not linears:
        raise ValueError("the model needs at least one nn.Linear")

    param_list = list(model.parameters())
    bytes_per_value = param_list[0].element_size() if param_list else 4
    param_bytes = sum(p.numel() * p.element_size() for p in param_list)
    trainable_bytes = sum(p.numel() * p.element_size() for p in param_list if p.requires_grad)

    # Walk the chain of tensors x -> layer 1 -> layer 2 -> ... and mark each one that some
    # backward node keeps. Every tensor of the chain is its own storage, so the activation
    # bytes are the sum of the marked tensors' sizes (plus the loss's target).
    width = linears[0].in_features
    widths = [width]          # width of tensor i of the chain (tensor 0 is the input x)
    kept = [False]            # whether backward keeps tensor i
    in_graph = False          # whether tensor i depends on a parameter
    for layer in layers:
        if isinstance(layer, nn.Linear):
            kept[-1] = True   # dL/dW = g^T x needs the layer's input
            width = layer.out_features
            in_graph = True
            widths.append(width)
            kept.append(False)
        elif isinstance(layer, nn.ReLU):
            widths.append(width)
            kept.append(in_graph)  # ReLU's backward reads its own output, if it is in the graph
        else:
            raise ValueError(f"only nn.Linear and nn.ReLU layers are supported, got {type(layer).__name__}")
    kept[-1] = True           # MSE keeps the prediction ...
    values_per_example = sum(w for w, k in zip(widths, kept) if k)
    values_per_example += linears[-1].out_features  # ... and the target

    return {
        "params": param_bytes,
        "grads": trainable_bytes,
        "optimizer_state": copies_per_optimizer[optimizer] * trainable_bytes,
        "activations": batch_size * values_per_example * bytes_per_value,
    }
''',
}
