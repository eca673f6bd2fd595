"""Read hidden tests through C code that raises no audit event (torch.from_file, torch.load)."""
THREAT = "read secrets"
DEFENCE = ("The worker's private mount namespace holds neither grader/hidden nor tests/ nor "
           "solutions/: C-level reads find nothing, whatever the audit hook sees.")
MODES = ("chroot",)  # the audit hook alone cannot stop C-level reads
TRICK = '''\
import os, coursekit, torch
repo = os.path.dirname(os.path.dirname(coursekit.__file__))
stolen = []
for rel in ("tests/toy_chapter/ch99_toy.py", "grader/hidden/ch99_toy.py", "grader/api.py"):
    path = os.path.join(repo, rel)
    for size in (4096, 2048, 512, 64):
        try:
            raw = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
            stolen.append(bytes(raw.tolist()).decode("utf-8", "replace"))
            break
        except Exception:
            pass
    try:
        torch.load(path, weights_only=True)
    except Exception as e:
        stolen.append(str(e)[:200])

def scaled_sum(x, alpha):
    raise ValueError(" | ".join(stolen)[:490] or "nothing")
'''
