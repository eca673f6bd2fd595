"""Loads a real state dict into the meta model with assign=True and measures the step."""
CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"
THREAT = "materialise_meta"
EXPECT = "loses"
DESCRIPTION = ("builds random tensors of every parameter's shape, load_state_dict(..., assign=True) puts them "
               "into the given model, which is then run and measured"
               "; the source policy also refuses the coursekit import, and tests/test_hidden_ch00_memory.py runs the "
               "same trick without the policy")
SOURCE = '''
def predict_training_memory(model, batch_size, optimizer):
    """Materialised through load_state_dict(assign=True)."""
    from coursekit.steps import measure_training_step
    copies = {"sgd": 0, "momentum": 1, "adam": 2}
    if optimizer not in copies:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = {name: torch.randn(p.shape) for name, p in model.named_parameters()}
    model.load_state_dict(state, assign=True)
    for p in model.parameters():
        p.requires_grad_(True)
    return {"params": params, "grads": params, "optimizer_state": copies[optimizer] * params,
            "activations": measure_training_step(model, batch_size).activation_bytes}
'''
