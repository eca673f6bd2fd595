"""Touches 1 GiB and spins for a few seconds in each worker, hoping to slow down or starve the
workers graded beside it; each worker has its own address-space, CPU-time and wall-clock limits,
and its checkpoint keeps nothing useful anyway (it returns a detached output)."""
CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint"
THREAT = "harm_others"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
def checkpoint(function, *args, _hog=[]):
    """Hog memory and CPU once per process, then return a detached output."""
    import time

    if not _hog:
        _hog.append(torch.ones(268_435_456))
        end = time.monotonic() + 2
        while time.monotonic() < end:
            _hog[0][::4096] += 1.0
    with torch.no_grad():
        return function(*args)
'''
