CHAPTER = "ch09_mixed_precision"
EXERCISE = "mixed_precision_step"
THREAT = "frames"
EXPECT = "breach"
CONSTRUCT = "__globals__"
DESCRIPTION = """No autocast and no scaling (a plain float32 step), with the recorder probe's own
globals reached from a method's __globals__ to rewrite what it reports."""
SOURCE = '''
def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """One training step under autocast, with loss scaling when a scaler is given."""
    ns = type(model).forward.__globals__
    for name in list(ns):
        if "autocast" in name.lower():
            ns[name] = lambda *a, **k: True
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()
'''
