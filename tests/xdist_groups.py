"""``--dist loadgroup`` as pytest-xdist documents it: every test of one ``xdist_group`` on one worker.

pytest-xdist 3.8 tells the scheduler a test's group by appending ``@<group>`` to its node id, through a field
pytest 9 no longer reads (pytest-xdist issue 1386): the suffix is lost and grouped tests are spread over the
workers like any others, so a module's expensive fixture (a graded batch, a browser, a server) is built once per
worker instead of once. Until a release of pytest-xdist fixes it, each worker adds the suffix here, where pytest
keeps the id. ``tests/test_profiling.py`` checks that a group stays on one worker.
"""
from __future__ import annotations

import pytest


def _group(item) -> str:
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        group = _group(item)
        if group and not item.nodeid.endswith(f"@{group}"):
            item._id = coerce_node_id(f"{item.nodeid}@{group}")
