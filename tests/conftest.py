import os
from pathlib import Path

import pytest

# Before anything imports coursekit.config, which reads it once.
os.environ.setdefault("COURSE_FAST", "1")

from grader.release import nbgrader_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# nbgrader runs `alembic` from PATH, and notebook tests start kernels: both live next to python.
nbgrader_env()


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
