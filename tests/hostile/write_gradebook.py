"""Overwrite the gradebook and a course file from Python: open(), sqlite3, pathlib."""
THREAT = "write"
DEFENCE = ("Writes outside the worker's directory are refused and reported by the audit hook; "
           "in the worker's mount namespace those paths do not exist and everything is read-only; "
           "the worker runs as a uid that owns nothing.")
EXPECT = "tried to"
TRICK = '''\
import pathlib, sqlite3
for path in ("@GRADEBOOK@", "@COURSE_FILE@"):
    try:
        with open(path, "w") as f:
            f.write("full marks for everyone")
    except Exception:
        pass
    try:
        pathlib.Path(path).write_text("full marks")
    except Exception:
        pass
try:
    db = sqlite3.connect("@GRADEBOOK@")
    db.execute("create table grades (score)")
except Exception:
    pass
'''
