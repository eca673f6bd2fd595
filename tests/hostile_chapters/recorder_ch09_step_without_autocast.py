"""mixed_precision_step that runs in float32 and rewrites what recorders saw into an autocast forward."""
CHAPTER = "ch09_mixed_precision"
EXERCISE = "mixed_precision_step"
THREAT = "recorder"
EXPECT = "loses"
DESCRIPTION = ("no autocast at all (a float32 step, numerically close); every list of recorded calls on the model "
               "and on the loss is rewritten to say autocast ran with the requested dtype")
SOURCE = '''
def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """Float32 step, recorded calls rewritten."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    for owner in (model, loss_fn):
        for call in getattr(owner, "calls", []):
            if isinstance(call, dict) and "autocast" in call:
                call["autocast"] = True
                if "dtype" in call:
                    call["dtype"] = str(dtype)
                    call["output"] = str(dtype)
    return loss.item()
'''
