# %% [markdown]
# # Scratch

# %% tags=["setup"]
import torch

# %% exercise="double"
def double(x):
    """Return 2x."""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION

# %% test="test_double" points=2
assert double(2) == 4
### BEGIN HIDDEN TESTS
assert double(3) == 6
### END HIDDEN TESTS
