"""Install tracing/profiling hooks and an excepthook that swallow failing asserts."""
THREAT = "later cells"
DEFENCE = ("sys.settrace and sys.setprofile are refused and reported by the audit hook (and the "
           "checks run in another process anyway); sys.excepthook is never consulted.")
EXPECT = "tried to install a"
TRICK = '''\
import sys, threading

def tracer(frame, event, arg):
    if event == "exception" and arg[0] is AssertionError:
        frame.f_locals.clear()
    return tracer

sys.excepthook = lambda *args: None
threading.settrace(tracer)
try:
    sys.setprofile(tracer)
except PermissionError:
    pass
sys.settrace(tracer)
'''
