"""Exhaust memory: one huge allocation, then unbounded growth inside the exercise function
(400 MB a step, reserved without being written, so the limit is reached in milliseconds)."""
THREAT = "resources"
DEFENCE = ("RLIMIT_AS turns the allocations into MemoryError, and the cgroup's memory limit "
           "kills a worker whose charged memory exceeds it; either way the problem fails with a "
           "memory-limit message.")
EXPECT = "memory limit"
TRICK = '''\
try:
    hoard = bytearray(10**11)
except MemoryError:
    pass
try:
    big = torch.empty(10**11)
except RuntimeError:
    pass
_wrong = scaled_sum

def scaled_sum(x, alpha):
    hoard = []
    while True:  # untouched pages: the address-space limit fires at once, even on a busy machine
        hoard.append(torch.empty(10**8))
'''
