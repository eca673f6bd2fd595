"""mixed_precision_step that computes the loss after leaving autocast and rewrites the loss recorder."""
CHAPTER = "ch09_mixed_precision"
EXERCISE = "mixed_precision_step"
THREAT = "recorder"
EXPECT = "loses"
DESCRIPTION = ("forward under autocast, but the loss outside it (same value for the usual float32 losses); the "
               "loss function's recorded calls are rewritten to say it ran under autocast")
SOURCE = '''
def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """Loss outside autocast, recorder rewritten."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        out = model(inputs)
    loss = loss_fn(out, targets)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    for call in getattr(loss_fn, "calls", []):
        call["autocast"] = True
    return loss.item()
'''
