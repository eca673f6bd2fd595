"""Find the worker's reply pipe and write forged replies to the judge from student code."""
THREAT = "grader modules"
DEFENCE = ("The judge validates every reply field by field and decodes values only with its own "
           "codec; a forged or garbled frame fails the problem as a malformed reply, and forged "
           "values are still compared with the judge's references.")
TRICK = '''\
import os, stat
_wrong_scaled_sum = scaled_sum

def scaled_sum(x, alpha):
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, (12).to_bytes(4, "big") + b'{"t": "ok"}!')
                os.write(fd, (5).to_bytes(4, "big") + b"\\x80\\x04K\\x01.")
        except OSError:
            pass
    return _wrong_scaled_sum(x, alpha)
'''
