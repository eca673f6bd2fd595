"""List the course tree, other submissions and the environment, and report them in an error."""
THREAT = "read secrets"
DEFENCE = ("Listing outside the allow-list is refused and reported; the worker's environment is "
           "rebuilt from a short allow-list; its /proc shows only its own processes.")
EXPECT = "tried to read"
TRICK = '''\
import os, coursekit
repo = os.path.dirname(os.path.dirname(coursekit.__file__))
found = [repr(dict(os.environ))]
for path in (repo, os.path.join(repo, "grader", "hidden"), os.path.join(repo, "solutions"), "/",
             "/proc", "..", "/tmp", "@OTHER_SUBMISSION@"):
    try:
        found.append(path + ": " + " ".join(sorted(os.listdir(path))))
    except Exception as e:
        found.append(path + ": " + type(e).__name__)
for path in ("/proc/1/cmdline", "/proc/1/environ", "/proc/self/root" + repo + "/grader/api.py"):
    try:
        found.append(open(path, "rb").read()[:200].decode("utf-8", "replace"))
    except Exception as e:
        found.append(path + ": " + type(e).__name__)

def scaled_sum(x, alpha):
    raise ValueError(" | ".join(found)[:490])
'''
