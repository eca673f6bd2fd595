"""Never finish: an infinite loop in a cell, so the grader times out (or hangs)."""
THREAT = "resources"
DEFENCE = ("The judge reads the worker's CPU time from its cgroup at every poll and kills it at the "
           "CPU-time limit (a wall-clock backstop stops code that only waits).")
EXPECT = "time limit"
SLOW = True
CPU_SECONDS = 2  # stopped by the CPU-time limit itself, well before LIMITS' wall-clock backstop of 8 s
TRICK = '''\
while True:
    pass
'''
