"""Never finish: an infinite loop in a cell, so the grader times out (or hangs)."""
THREAT = "resources"
DEFENCE = "The judge's poll deadline kills the worker's process group at the wall-clock limit."
EXPECT = "time limit"
SLOW = True
TRICK = '''\
while True:
    pass
'''
