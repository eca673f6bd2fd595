"""Rewrite the sandbox's own policy tables and integrity check from inside the worker."""
THREAT = "grader modules"
DEFENCE = ("The audit hook and the integrity check keep everything they use in closures built "
           "before student code ran; rebinding the policy module's globals, or builtins, changes "
           "nothing they do. Reads of hidden tests are still refused and reported.")
EXPECT = "tried to"
TRICK = '''\
import builtins, os, sys, coursekit
policy = sys.modules["grader.sandbox.policy"]
policy._NOT_INTERESTING = frozenset({"open", "import", "os.listdir", "os.scandir", "compile"})
policy._WRITES, policy._READS, policy._ALWAYS, policy.DANGEROUS = {}, {}, {}, frozenset()
policy.integrity_check = lambda snapshot: (lambda: None)
policy.Denied = policy.DeniedImport = type("Allowed", (Exception,), {})
builtins.issubclass = lambda *args: False
builtins.len = lambda obj: 0
repo = os.path.dirname(os.path.dirname(coursekit.__file__))
stolen = []
for rel in ("tests/toy_chapter/ch99_toy.py", "grader/hidden/ch99_toy.py"):
    try:
        stolen.append(open(os.path.join(repo, rel)).read())
    except BaseException:
        pass

def scaled_sum(x, alpha):
    raise ValueError("".join(stolen)[:490] or "nothing")
'''
