"""coursekit.config: fast mode and the thread policy applied when coursekit is imported."""
import os
import subprocess
import sys

import pytest

CODE = "import coursekit, torch; print(torch.get_num_threads(), coursekit.FAST)"


def _run(**env_overrides):
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_THREADS", "OMP_NUM_THREADS", "COURSE_FAST")}
    env.update(env_overrides)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("overrides, expected", [
    ({}, "1 False"),
    ({"COURSE_THREADS": "2"}, "2 False"),
    ({"OMP_NUM_THREADS": "2", "COURSE_FAST": "1"}, "2 True"),
    ({"COURSE_THREADS": "1", "OMP_NUM_THREADS": "2", "COURSE_FAST": "0"}, "1 False"),
])
def test_threads_and_fast_mode(overrides, expected):
    result = _run(**overrides)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.parametrize("value", ["0", "two"])
def test_bad_thread_count_is_refused_with_its_name(value):
    result = _run(COURSE_THREADS=value)
    assert result.returncode != 0 and "COURSE_THREADS must be a positive integer" in result.stderr
