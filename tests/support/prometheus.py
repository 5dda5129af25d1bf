"""A real Prometheus (Debian's ``prometheus`` binary) for the tests that read engines' series through it.

``prometheus`` is a fixture (tests/conftest.py offers it to every test): it starts Prometheus on a free
port with a 1 s scrape interval and yields ``(url, scrape)``, where ``scrape(urls)`` points it at engine
endpoints (reloaded live).
"""

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.support.processes import free_port, wait_for

INSTALLED = bool(shutil.which("prometheus"))
NOT_INSTALLED = "Prometheus is not installed (apt-get install prometheus)"
GLOBAL = "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Callable[[list[str]], None]]]:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(GLOBAL + "scrape_configs: []\n")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=(tmp_path / "prometheus.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ok(f"{url}/-/ready"), timeout=60)

    def scrape(urls: list[str]) -> None:
        targets = ", ".join(f'"{u.split("://", 1)[1]}"' for u in urls)
        config.write_text(
            GLOBAL + f"scrape_configs:\n  - job_name: vllm\n    static_configs: [{{targets: [{targets}]}}]\n"
        )
        requests.post(f"{url}/-/reload", timeout=10).raise_for_status()

    yield url, scrape
    proc.terminate()
    proc.wait(timeout=30)


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False
