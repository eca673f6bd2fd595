"""The forbidden torch.utils.checkpoint, hidden in a string handed to get_ipython().run_line_magic: to a static
reading of the cell that is a call with a string argument, and the worker's shell once ran a %time body as code.
The policy refuses get_ipython in an exercise cell, and the worker's shell runs nothing anyway."""
CHAPTER = "ch02_checkpointing"
EXERCISE = "checkpoint"
THREAT = "policy_escape"
EXPECT = "breach"
CONSTRUCT = "get_ipython"
DESCRIPTION = __doc__
SOURCE = '''\
def checkpoint(function, *args):
    return _library(function, *args)


get_ipython().run_line_magic("time", """
import torch.utils.checkpoint as library
def _library(function, *args):
    return library.checkpoint(function, *args, use_reentrant=False)
""")
'''
