"""Replace grader modules in sys.modules, including the codec that encodes fetched values."""
THREAT = "grader modules"
DEFENCE = ("Replies are decoded by the judge's own codec and must be well-formed plain data; a "
           "fake encoder can only make the worker send wrong or malformed values, which fail.")
TRICK = '''\
import sys, types, json
fake_api = types.ModuleType("grader.api")
fake_api.run_hidden = lambda *args, **kwargs: None
fake_api.fetch = lambda value: value
sys.modules["grader.api"] = fake_api
codec = sys.modules["grader.sandbox.codec"]
codec.encode = lambda value: json.dumps(True)
probes = sys.modules["grader.probes.shared"]
probes.forward_backward = lambda *args, **kwargs: True
'''
