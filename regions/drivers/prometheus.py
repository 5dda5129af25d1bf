"""The one place a Prometheus client is built: explicit connect and read timeouts and bounded retries, so a
hung Prometheus costs the router or a report a bounded wait, never a stuck loop."""

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

CONNECT_TIMEOUT_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 10.0


def prometheus_client(
    url: str,
    *,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    retries: int = 2,
) -> PrometheusConnect:
    """A client for the Prometheus at ``url``; ``retries`` counts extra tries on connect errors and 5xx."""
    retry = Retry(total=retries, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504])
    return PrometheusConnect(
        url=url,
        disable_ssl=True,
        retry=retry,
        timeout=(connect_timeout, read_timeout),  # type: ignore[arg-type]  # requests takes a pair
    )
