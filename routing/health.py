"""Active health checks and load signals for every ready engine endpoint.

Timings, against Envoy's outlier detection defaults (5 consecutive 5xx, 10 s interval, 30 s base
ejection): Envoy infers health passively from live traffic, so it needs several errors before it acts. We
probe ``/health`` every second with a 0.5 s timeout, so 2 consecutive failures eject an endpoint within
about 2 s of it dying, and 3 consecutive successes (3 s) restore it, enough to ride out an engine that
answers once while restarting. Gateways cover the gap passively: a connect error or a 5xx before the
first byte is retried on the next endpoint and that endpoint is skipped for 30 s (Envoy's base ejection),
so no client request fails while the table catches up. The counts are ``choices.FAILURES_TO_EJECT`` and
``SUCCESSES_TO_RESTORE``; ``services.record_health`` applies them, each change of state a compare-and-set
written with its timeline event.

Load comes from vLLM's own gauges (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``): from the region's Prometheus through prometheus-api-client when the region
names one, else from each endpoint's ``/metrics``.
"""

import logging
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from core.services.leases import holder_name, lease_hold, lease_release_on_stop
from regions.drivers.prometheus import prometheus_client
from regions.models import Region
from routing import selectors, services
from routing.models import RouteTable

log = logging.getLogger(__name__)
PROBE_INTERVAL_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 0.5
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache",
}


def probe(url: str) -> tuple[bool, str, float | None]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=PROBE_TIMEOUT_SECONDS) as reply:
            ok = reply.status == 200
            return ok, "" if ok else f"/health answered {reply.status}", (time.perf_counter() - started) * 1e3
    except urllib.error.HTTPError as exc:
        return False, f"/health answered {exc.code}", None
    except (OSError, ValueError) as exc:
        return False, f"/health failed: {getattr(exc, 'reason', exc)}", None


def load_from_metrics(url: str) -> dict[str, float]:
    """Sum vLLM's gauges over engines from one endpoint's /metrics (no Prometheus in the region)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=PROBE_TIMEOUT_SECONDS) as reply:
            text = reply.read().decode()
    except (OSError, ValueError):
        return {}
    load: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key = GAUGES.get(family.name)
        for sample in family.samples if key else []:
            load[str(key)] = load.get(str(key), 0.0) + float(sample.value)
    return load


def load_from_prometheus(prometheus_url: str, urls: list[str]) -> dict[str, dict[str, float]]:
    """{endpoint url: gauges} for the endpoints Prometheus scrapes (matched on the instance label)."""
    by_instance = {urlsplit(url).netloc: url for url in urls}
    found: dict[str, dict[str, float]] = {}
    # Inside the one-second probe round: a short wait and no retry (the next round is the retry).
    prometheus = prometheus_client(
        prometheus_url, connect_timeout=PROBE_TIMEOUT_SECONDS, read_timeout=1.0, retries=0
    )
    for metric, key in GAUGES.items():
        for series in prometheus.custom_query(f"sum by (instance) ({metric})"):
            url = by_instance.get(series["metric"].get("instance", ""))
            if url:
                found.setdefault(url, {})[key] = float(series["value"][1])
    return found


def _loads(endpoints: list[tuple[str, Region]], pool: ThreadPoolExecutor) -> dict[str, dict[str, float]]:
    by_region: dict[str, list[str]] = {}
    regions = {}
    for url, region in endpoints:
        by_region.setdefault(region.code, []).append(url)
        regions[region.code] = region
    loads: dict[str, dict[str, float]] = {}
    for code, urls in by_region.items():
        prometheus = regions[code].prometheus_url
        if prometheus:
            try:
                loads.update(load_from_prometheus(prometheus, urls))
                continue
            except Exception:  # Prometheus down: ask the endpoints themselves
                pass
        loads.update(zip(urls, pool.map(load_from_metrics, urls), strict=True))
    return loads


def check_all() -> int:
    """Probe every ready endpoint once; returns how many changed state."""
    endpoints = selectors.active_endpoints()
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(probe, [url for url, _ in endpoints]))
        loads = _loads(endpoints, pool)
    changed = 0
    for (url, region), (ok, error, latency) in zip(endpoints, results, strict=True):
        changed += services.record_health(url, region, ok, error, latency, loads.get(url, {}))
    services.forget_endpoints(url for url, _ in endpoints)
    return changed


def cycle() -> RouteTable:
    """One round of the routing loop: probe, then publish the table if anything it depends on changed."""
    check_all()
    return services.publish()


LEASE = "router"
LEASE_SECONDS = 10.0  # a dead router's standby takes over within this (plus a round)


def run_forever(
    interval: float = PROBE_INTERVAL_SECONDS, rounds: int | None = None, holder: str | None = None
) -> None:
    """The routing loop. Any number may run (one per control-plane replica): the one holding the
    ``router`` lease probes and publishes, the others wait on standby and take over when it stops
    renewing (it died) or releases it (a clean stop)."""
    me = holder or holder_name("router")
    done, leading = 0, False
    try:
        while rounds is None or done < rounds:
            started = time.monotonic()
            try:
                leading = _lead(me, leading)
                if leading:
                    cycle()
            except Exception:  # one bad round (a database restart) must not stop routing
                log.exception("routing round failed")
            done += 1
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    finally:  # a clean stop (Ctrl-C, or SIGTERM through the ``route`` command) hands the lease on now
        if leading:
            lease_release_on_stop(LEASE, me)


def _lead(me: str, leading: bool) -> bool:
    now = lease_hold(LEASE, me, LEASE_SECONDS)
    if now != leading:
        log.info("router %s is %s", me, "now the active router" if now else "on standby")
    return now
