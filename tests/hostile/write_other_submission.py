"""Delete another student's submission and rename course files."""
THREAT = "write"
DEFENCE = ("shutil.rmtree/os.remove/os.rename outside the worker's directory are refused and "
           "reported; in the mount namespace the other submission is not there at all.")
EXPECT = "tried to"
TRICK = '''\
import os, shutil
for action in (lambda: shutil.rmtree("@OTHER_SUBMISSION@"),
               lambda: os.remove("@OTHER_SUBMISSION@/notebook.ipynb"),
               lambda: os.rename("@COURSE_FILE@", "@COURSE_FILE@.bak"),
               lambda: os.chmod("@COURSE_FILE@", 0o777),
               lambda: os.symlink("@GRADEBOOK@", "gradebook-link")):
    try:
        action()
    except Exception:
        pass
'''
