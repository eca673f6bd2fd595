"""Fill the disk with files in the worker's own directory."""
THREAT = "resources"
DEFENCE = ("RLIMIT_FSIZE caps each file; the workers' tmpfs has a fixed size and inode count; "
           "the directory is removed when the problem ends.")
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
