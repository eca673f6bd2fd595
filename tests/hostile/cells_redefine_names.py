"""Redefine the names a test cell would use: run_hidden, fetch, the check helpers."""
THREAT = "later cells"
DEFENCE = ("Test cells never run in the student's namespace; the judge's own grader.api and "
           "coursekit are used. Importing grader in the worker is refused and reported.")
EXPECT = "tried to import grader"
TRICK = '''\
def run_hidden(*args, **kwargs):
    return None

def fetch(value):
    return value

def check_close(*args, **kwargs):
    return None

import builtins
_import = builtins.__import__

def fake_import(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if name.startswith("grader"):
        module.run_hidden = run_hidden
    return module

builtins.__import__ = fake_import
import grader.api
'''
