"""Fill the disk with files in the worker's own directory."""
THREAT = "resources"
DEFENCE = ("RLIMIT_FSIZE caps each file; the worker's own tmpfs has a fixed size and inode count "
           "and is charged to its cgroup; it is unmounted with the worker's mount namespace.")
MODES = ("chroot", "userns")  # plain mode has no private tmpfs: total disk use is unbounded there
TRICK = '''\
import os
chunk = b"x" * 10**7
for i in range(1000):
    try:
        with open(f"fill{i}", "wb") as f:
            for _ in range(100):
                f.write(chunk)
    except OSError:
        if i > 100:
            break
'''
