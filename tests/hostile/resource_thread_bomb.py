"""Start threads until the machine gives up, by threading and by torch's thread pools."""
THREAT = "resources"
DEFENCE = ("Python thread creation is disabled in the worker; torch's pools are capped by "
           "RLIMIT_NPROC on the worker's uid; the whole uid is killed at the end.")
TRICK = '''\
import threading, time, torch
for _ in range(1000):
    try:
        threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
    except Exception:
        break
try:
    torch.set_num_threads(512)
    torch.set_num_interop_threads(512)
    (torch.randn(512, 512) @ torch.randn(512, 512)).sum()
except Exception:
    pass
'''
