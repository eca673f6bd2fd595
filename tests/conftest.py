import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = str(Path(sys.executable).parent)
# nbgrader runs `alembic` from PATH; jupyter kernels are found next to this python.
if BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("COURSE_FAST", "1")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
