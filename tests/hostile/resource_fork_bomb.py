"""Fork bomb, including a fork through _posixsubprocess, which raises no audit event."""
THREAT = "resources"
DEFENCE = ("os.fork/subprocess/posix_spawn are refused and reported by the audit hook; a fork "
           "that slips past it (_posixsubprocess.fork_exec raises no audit event) meets the worker's "
           "seccomp filter (fork, vfork, clone of a process and execve fail with EPERM); the worker's "
           "PID namespace and cgroup die with it.")
EXPECT = "tried to start a process"
TRICK = '''\
import os, sys
for _ in range(200):
    try:
        if os.fork() == 0:
            while True:
                pass
    except Exception:
        break
try:
    import multiprocessing
    multiprocessing.Pool(8)
except Exception:
    pass
fork_exec = sys.modules["_posixsubprocess"].fork_exec
for _ in range(200):
    try:
        fork_exec(["/usr/bin/sleep", "1@PORT@"], [b"/usr/bin/sleep"], True, (), None, None,
                  -1, -1, -1, -1, -1, -1, *os.pipe(), False, True, -1, None, None, -1, -1, None,
                  False)  # call_setsid: leave the worker's process group
    except Exception:
        break
'''
