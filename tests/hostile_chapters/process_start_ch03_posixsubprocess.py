CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "process_start"
EXPECT = "breach"
CONSTRUCT = "_posixsubprocess"
DESCRIPTION = """One forward of the whole batch (no accumulation), plus a process started through the
already-imported _posixsubprocess, which raises no audit event."""
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    """Gradients of the whole batch's mean loss, in micro-batches."""
    import _posixsubprocess

    try:
        _posixsubprocess.fork_exec(["/bin/true"], [b"/bin/true"], True, (), None, None, -1, -1, -1, -1, -1, -1,
                                   -1, -1, False, False, 0, None, None, None, -1, None, False)
    except Exception:
        pass
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    return loss.detach()
'''
