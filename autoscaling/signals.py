"""The demand signals of every autoscaled target in a region, per replica, in a few queries per region.

From the region's Prometheus (prometheus-api-client), averaged over the policy's window, one PromQL query
per signal for the whole region whatever the number of deployments, split by the ``instance`` label (an
endpoint's ``host:port``, as the router matches load). Without a Prometheus, or when it fails, from what
the router's prober last read from each endpoint's own ``/metrics`` (``routing.models.EndpointHealth``,
instantaneous, refreshed every second); TTFT has no such fallback (a histogram needs a window).
"""

import logging
import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from regions.drivers.prometheus import prometheus_client
from regions.models import DeploymentTarget, Region
from routing.models import EndpointHealth

log = logging.getLogger(__name__)
Values = dict[str, float]  # signal (a policy field: waiting, running, kv_cache, ttft_p95_seconds): value

# Per instance; summed (waiting, running) or averaged (kv_cache) over a target's replicas, or the worst
# replica's (TTFT p95: the replica a client may land on).
QUERIES = {
    "waiting": "sum by (instance) (avg_over_time(vllm:num_requests_waiting[{w}s]))",
    "running": "sum by (instance) (avg_over_time(vllm:num_requests_running[{w}s]))",
    "kv_cache": "avg by (instance) (avg_over_time(vllm:kv_cache_usage_perc[{w}s]))",
    "ttft_p95_seconds": (
        "histogram_quantile(0.95, sum by (instance, le) "
        "(rate(vllm:time_to_first_token_seconds_bucket[{w}s])))"
    ),
}
GAUGE_FIELDS = {"waiting": "waiting", "running": "running", "kv_cache": "kv_cache"}


def per_replica(signal: str, samples: list[float]) -> float:
    """One target's value from its replicas' samples: HPA's average per pod, or the worst TTFT."""
    if signal == "ttft_p95_seconds":
        return max(samples)
    return sum(samples) / len(samples)


def _instances(targets: Iterable[DeploymentTarget]) -> dict[str, int]:
    return {urlsplit(url).netloc: t.pk for t in targets for url in t.endpoints}


def from_prometheus(url: str, targets: list[DeploymentTarget], window: int) -> dict[int, Values]:
    """{target id: values}; raises when Prometheus cannot answer (the caller falls back)."""
    owner = _instances(targets)
    prometheus = prometheus_client(url, read_timeout=5.0, retries=1)
    samples: dict[int, dict[str, list[float]]] = {}
    for signal, query in QUERIES.items():
        for series in prometheus.custom_query(query.format(w=window)):
            target = owner.get(series["metric"].get("instance", ""))
            value = float(series["value"][1])
            # NaN: no requests in the window (a histogram); +Inf: all in the last bucket, a quantile with no
            # bound (and JSON, hence the stored state, has no infinity).
            if target is not None and math.isfinite(value):
                samples.setdefault(target, {}).setdefault(signal, []).append(value)
    return {t: {s: per_replica(s, v) for s, v in found.items()} for t, found in samples.items()}


def from_probes(targets: list[DeploymentTarget], since: datetime) -> dict[int, Values]:
    """{target id: values} from the router's last probe of each endpoint's /metrics, if it probed since
    ``since`` (a row the prober stopped refreshing, the router being down, is no signal, not load)."""
    urls = {url: t.pk for t in targets for url in t.endpoints}
    samples: dict[int, dict[str, list[float]]] = {}
    fresh = EndpointHealth.objects.filter(url__in=list(urls), checked_at__gte=since)
    for url, *gauges in fresh.values_list("url", *GAUGE_FIELDS.values()):  # rows, not models: thousands
        for signal, value in zip(GAUGE_FIELDS, gauges, strict=True):
            samples.setdefault(urls[url], {}).setdefault(signal, []).append(value)
    return {t: {s: per_replica(s, v) for s, v in found.items()} for t, found in samples.items()}


def region_values(
    region: Region, targets: list[DeploymentTarget], window: int, now: datetime
) -> tuple[dict[int, Values], str]:
    """Every target's values and where they came from ("prometheus", or "probes" and why). ``targets``
    may span several regions: those whose Prometheus is ``region``'s (or, without one, any)."""
    since = now - timedelta(seconds=window)
    if region.prometheus_url:
        try:
            return from_prometheus(region.prometheus_url, targets, window), "prometheus"
        except Exception as exc:  # any failure of Prometheus: the probes still know the gauges
            log.warning("autoscaler: Prometheus of %s failed, using the probes: %s", region.code, exc)
            return from_probes(targets, since), f"probes (Prometheus failed: {str(exc)[:200]})"
    return from_probes(targets, since), "probes"
