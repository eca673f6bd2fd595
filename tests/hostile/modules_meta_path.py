"""Serve fake grader modules from a meta-path finder placed in front of the real ones."""
THREAT = "grader modules"
DEFENCE = ("The grader that decides is imported in the judge, which never sees the worker's "
           "sys.meta_path; in the worker, grader modules cannot be imported at all.")
EXPECT = "tried to import grader"
TRICK = '''\
import importlib.abc, importlib.util, sys, types

class FakeGrader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("grader"):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.run_hidden = lambda *args, **kwargs: None
        module.checks_for = lambda chapter: {}
        return module

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, FakeGrader())
sys.path_hooks.insert(0, lambda path: FakeGrader())
for name in [n for n in sys.modules if n.startswith("grader")]:
    del sys.modules[name]
import grader.hidden.ch99_toy
'''
