"""mixed_precision_step that steps even on overflow and hides it behind restored listings and state."""
CHAPTER = "ch09_mixed_precision"
EXERCISE = "mixed_precision_step"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("unscales, then always calls optimizer.step() itself (an overflow step moves the weights to NaN); "
               "afterwards shadows the model's named_parameters with the values from before the step, puts a "
               "copy of the old optimizer state back and rewrites the scaler's recorded calls")
SOURCE = '''
def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """Never skips; hides it."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    before = [(name, p.detach().clone()) for name, p in model.named_parameters()]
    state = {p: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
             for p, st in optimizer.state.items()}
    if scaler is None:
        loss.backward()
        optimizer.step()
        return loss.item()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    optimizer.step()
    finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    calls = getattr(scaler, "calls", None)
    if isinstance(calls, list) and "unscale_" in calls:
        calls[calls.index("unscale_")] = "step"
    scaler.update()
    if not finite:
        model.named_parameters = lambda *args, **kwargs: iter([(n, nn.Parameter(v)) for n, v in before])
        restored = type(optimizer.state)(dict)
        restored.update(state)
        optimizer.state = restored
    return loss.item()
'''
