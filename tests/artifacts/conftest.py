"""The platform's home store, a local folder per test, for the artifacts tests."""

import pytest

from artifacts.drivers.stores import LocalStore


@pytest.fixture
def home(settings, tmp_path):
    settings.ARTIFACT_HOME_STORE = {"kind": "local", "root": str(tmp_path / "home")}
    settings.ARTIFACT_COPY_TUNING = {"part_size": 5 * 1024 * 1024, "concurrency": 4}
    return LocalStore(tmp_path / "home")
