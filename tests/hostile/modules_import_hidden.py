"""Import the hidden tests and use their reference implementation as the answer."""
THREAT = "grader modules"
DEFENCE = ("grader.* imports are refused and reported; the files are not in the worker's file "
           "system view; reading them directly is refused too.")
EXPECT = "tried to"
TRICK = '''\
import importlib, importlib.util, os, coursekit
try:
    from grader.hidden.ch99_toy import _scaled_sum as scaled_sum
except ImportError:
    pass
try:
    hidden = importlib.import_module("grader.hidden.ch99_toy")
    scaled_sum = hidden._scaled_sum
except Exception:
    pass
repo = os.path.dirname(os.path.dirname(coursekit.__file__))
for path in (os.path.join(repo, "grader", "hidden", "ch99_toy.py"),
             os.path.join(repo, "tests", "toy_chapter", "ch99_toy.py")):
    try:
        spec = importlib.util.spec_from_file_location("stolen", path)
        stolen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(stolen)
        scaled_sum = stolen._scaled_sum
    except Exception:
        pass
'''
