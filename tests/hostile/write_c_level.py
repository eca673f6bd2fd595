"""Write the gradebook and course files through C code that raises no audit event (torch.save)."""
THREAT = "write"
DEFENCE = ("The worker's uid owns nothing, the paths are absent from its mount namespace, and "
           "everything it can see outside its own directory is mounted read-only.")
MODES = ("chroot",)
TRICK = '''\
import torch, numpy as np
for path in ("@GRADEBOOK@", "@COURSE_FILE@", "@OTHER_SUBMISSION@/notebook.ipynb"):
    try:
        torch.save({"score": 100}, path)
    except Exception:
        pass
try:
    np.arange(3).tofile("@COURSE_FILE@")
except Exception:
    pass
'''
