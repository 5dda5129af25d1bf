"""Every S3 and Prometheus client is built by one factory with explicit timeouts (and bounded retries), so a
hung endpoint costs a bounded wait instead of a stuck reconciler, router or report."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from artifacts.drivers.stores import s3_client, store_from_config
from regions.drivers.prometheus import prometheus_client
from routing.health import load_from_prometheus


def test_the_s3_factory_sets_connect_and_read_timeouts_and_bounded_retries():
    config = s3_client(endpoint_url="http://127.0.0.1:1", region_name="eu-west-1").meta.config
    assert (config.connect_timeout, config.read_timeout) == (5, 60)
    assert config.retries == {"total_max_attempts": 4, "mode": "standard"}  # 3 retries after the first
    store = store_from_config({"kind": "s3", "bucket": "b", "endpoint_url": "http://127.0.0.1:1"})
    assert store.client.meta.config.read_timeout == 60  # type: ignore[attr-defined]


def test_the_prometheus_factory_sets_connect_and_read_timeouts_and_bounded_retries():
    prometheus = prometheus_client("http://127.0.0.1:1", connect_timeout=0.5, read_timeout=1.5, retries=0)
    assert prometheus._timeout == (0.5, 1.5)
    assert prometheus._session.get_adapter("http://x").max_retries.total == 0


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers: a hung Prometheus."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for conn in held:
        conn.close()


def test_a_hung_prometheus_fails_the_routers_load_query_within_its_timeout(silent_server):
    outcome: list[BaseException] = []

    def query() -> None:
        try:
            load_from_prometheus(silent_server, ["http://10.0.0.1:8000"])
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the load query waited on a hung Prometheus with no timeout"
    assert outcome and time.monotonic() - started < 5
