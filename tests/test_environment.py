"""environment.yml and pyproject.toml pin the same packages."""
import re
import tomllib

from conftest import ROOT


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    listed = {_norm(line.strip()[2:]) for line in lines[start + 1:] if line.strip().startswith("- ")}
    listed.discard("-e.")
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject: {wanted - listed}"


def test_every_dependency_is_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["test"]:
        assert "==" in req, f"{req} is not pinned"
    assert "torch==2.13.0" in project["dependencies"]
    assert any(r.startswith("triton==") and "sys_platform == 'linux'" in r for r in project["dependencies"])
