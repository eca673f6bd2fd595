CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint"
THREAT = "frames"
EXPECT = "breach"
CONSTRUCT = "__traceback__"
DESCRIPTION = """Keeps every activation (no checkpointing at all) and reaches the caller's globals
through an exception's traceback to replace the trusted measurement with a lie."""
SOURCE = '''
def checkpoint(function, *args):
    """Run function(*args) keeping only the inputs; recompute in backward."""
    try:
        raise RuntimeError
    except RuntimeError as e:
        frame = e.__traceback__.tb_frame.f_back
    caller = frame.f_globals
    for name, value in list(caller.items()):
        if callable(value) and "saved" in name:
            caller[name] = lambda *a, **k: 0
    return function(*args)
'''
