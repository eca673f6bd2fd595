"""Flood stdout and stderr with gigabytes of output."""
THREAT = "resources"
DEFENCE = ("Python-level output goes to a stream that keeps only output_bytes; file-level output "
           "meets RLIMIT_FSIZE; nothing the student prints reaches feedback.")
TRICK = '''\
import os, sys
try:
    print("x" * 10**9)
except MemoryError:
    pass
for _ in range(200):
    try:
        os.write(1, b"y" * 10**6)
        sys.stderr.write("z" * 10**6)
    except OSError:
        break
'''
