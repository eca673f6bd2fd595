"""Materialises the meta model with to_empty and measures one real training step."""
CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"
THREAT = "materialise_meta"
EXPECT = "loses"
DESCRIPTION = ("deep-copies the meta model, makes it real with to_empty, fills the weights and measures a real "
               "step with measure_training_step instead of predicting"
               "; the source policy also refuses the coursekit import, and tests/test_hidden_ch00_memory.py runs the "
               "same trick without the policy")
SOURCE = '''
def predict_training_memory(model, batch_size, optimizer):
    """Measured, not predicted."""
    import copy
    from coursekit.steps import measure_training_step
    copies = {"sgd": 0, "momentum": 1, "adam": 2}
    if optimizer not in copies:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")
    real = copy.deepcopy(model).to_empty(device="cpu")
    with torch.no_grad():
        for p in real.parameters():
            p.normal_()
    params = sum(p.numel() * p.element_size() for p in real.parameters())
    return {"params": params, "grads": params, "optimizer_state": copies[optimizer] * params,
            "activations": measure_training_step(real, batch_size).activation_bytes}
'''
