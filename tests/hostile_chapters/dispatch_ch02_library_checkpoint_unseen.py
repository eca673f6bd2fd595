CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint"
THREAT = "dispatch"
EXPECT = "breach"
CONSTRUCT = "_python_dispatch"
DESCRIPTION = """torch.utils.checkpoint, which the text forbids, run with the dispatch modes switched
off so that the probes that watch recomputation see plain operators."""
SOURCE = '''
def checkpoint(function, *args):
    """Run function(*args) keeping only the inputs; recompute in backward."""
    from torch.utils import _python_dispatch as d
    from torch.utils.checkpoint import checkpoint as library

    with d._disable_current_modes():
        return library(function, *args, use_reentrant=False)
'''
