"""Start threads until the machine gives up, by threading and by torch's thread pools."""
THREAT = "resources"
DEFENCE = ("Python thread creation is disabled in the worker; torch's native pools meet the "
           "cgroup's task cap and share its one core of CPU quota; everything dies with the worker.")
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
