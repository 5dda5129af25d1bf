"""The structure holds: apps depend one way (the import-linter contracts in pyproject.toml), no module
circle inside an app, no import inside a function to hide one (scripts/structure --check)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_apps_depend_one_way_and_the_gateway_stays_django_free() -> None:
    result = _run(str(Path(sys.executable).with_name("lint-imports")), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


def test_no_circles_and_no_imports_hidden_in_functions() -> None:
    result = _run(sys.executable, "scripts/structure", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
