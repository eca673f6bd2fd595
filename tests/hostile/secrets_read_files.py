"""Read hidden tests and solutions with open() and smuggle them out in an exception message."""
THREAT = "read secrets"
DEFENCE = ("The files do not exist in the worker's file system view, reads outside the allow-list "
           "are refused and reported by the audit hook, and stdout never reaches feedback.")
EXPECT = "tried to read"
TRICK = '''\
import glob, os, coursekit
repo = os.path.dirname(os.path.dirname(coursekit.__file__))
stolen = []
for pattern in ("grader/hidden/*.py", "tests/toy_chapter/*.py", "solutions/*.py", "grader/*.py",
                "../grader/hidden/*.py"):
    for path in [os.path.join(repo, pattern)] + glob.glob(os.path.join(repo, pattern)):
        try:
            with open(path) as f:
                stolen.append(f.read())
        except Exception:
            pass
for path in ("grader/hidden/ch99_toy.py", os.path.join(repo, "tests/toy_chapter/ch99_toy.py")):
    try:
        stolen.append(open(path).read())
    except Exception:
        pass
print("\\n".join(stolen))
_wrong_scaled_sum = scaled_sum

def scaled_sum(x, alpha):
    raise ValueError("".join(stolen)[:400] or "nothing to steal")
'''
