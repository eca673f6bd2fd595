"""Replaces every meta parameter with a real one and runs the step on the model it was given."""
CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"
THREAT = "materialise_meta"
EXPECT = "loses"
DESCRIPTION = ("assigns new real nn.Parameters of the same shapes to every Linear (attribute assignment), then "
               "measures a real training step of the given model"
               "; the source policy also refuses the coursekit import, and tests/test_hidden_ch00_memory.py runs the "
               "same trick without the policy")
SOURCE = '''
def predict_training_memory(model, batch_size, optimizer):
    """Real weights swapped in, then measured."""
    from coursekit.steps import measure_training_step
    copies = {"sgd": 0, "momentum": 1, "adam": 2}
    if optimizer not in copies:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.weight = nn.Parameter(torch.randn(layer.out_features, layer.in_features))
            if layer.bias is not None:
                layer.bias = nn.Parameter(torch.randn(layer.out_features))
    return {"params": params, "grads": params, "optimizer_state": copies[optimizer] * params,
            "activations": measure_training_step(model, batch_size).activation_bytes}
'''
