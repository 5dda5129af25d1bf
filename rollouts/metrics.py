"""The samples a rollout step is judged on, for the candidate and the baseline over the same window.

Two sources: the gateway's own per-request records (``billing.models.UsageRecord``, one database query
for every gateway metric of the spec) and vLLM's series in the region's Prometheus (one query per metric,
both sides at once, split by the ``instance`` label: the endpoint's ``host:port``, as the router reads
load). ``measure`` never raises for Prometheus: a query that fails or times out makes that metric
``inconclusive`` with the error as its reason, and once Prometheus is unreachable the remaining metrics
are not asked for (each would wait out the same timeout).
"""

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import requests
from django.db.models import Q
from prometheus_api_client import PrometheusApiClientException

from billing.models import UsageRecord
from regions.drivers.prometheus import prometheus_client
from rollouts.analysis import (
    GATEWAY,
    GAUGE,
    AnalysisSpec,
    Measurement,
    MetricSpec,
    judge_errors,
    judge_gauge,
    judge_histogram,
    judge_latency,
    unmeasured,
)

CANDIDATE, BASELINE = "candidate", "baseline"
# An analysis run is one of many (every step of every rollout): a Prometheus that hangs costs it seconds.
CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS = 2.0, 5.0
GATEWAY_RULES = {
    "ttft": "ttft_ms/1000 of 2xx answers (latency_ms/1000 when not streamed)",
    "latency": "latency_ms/1000 of 2xx answers",
    "tokens_per_second": "completion_tokens / (latency_ms - ttft_ms) × 1000 of 2xx streams with tokens",
    "error_rate": "status >= 500 (timeouts are 5xx) out of every status but 499 (the client went away); "
    "the candidate also gets every attempt at it that failed before the first byte (candidate_errors)",
}


@dataclass(frozen=True)
class Side:
    """One side of the comparison: the version it serves (``model@1.2.0``, as ``UsageRecord.version``
    holds it), its engines' base URLs, and the ``UsageRecord.track`` values that count as its traffic."""

    version: str
    endpoints: tuple[str, ...]
    tracks: tuple[str, ...]


@dataclass
class Requests:
    """One side's gateway records in the window, as samples per metric."""

    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tokens_per_second: list[float] = field(default_factory=list)
    errors: int = 0
    total: int = 0

    def fail(self, attempts: int) -> None:
        """Attempts that failed before the first byte, retried elsewhere: errors the client never saw."""
        self.total += attempts
        self.errors += attempts

    def add(self, status: int, latency_ms: float, ttft_ms: float | None, tokens: int, stream: bool) -> None:
        if status == 499:  # the client left: neither an answer nor the engine's error
            return
        self.total += 1
        self.errors += status >= 500
        if not 200 <= status < 300:
            return
        self.latency.append(latency_ms / 1000)
        first = ttft_ms if ttft_ms is not None else (None if stream else latency_ms)
        if first is not None:
            self.ttft.append(first / 1000)
        if stream and ttft_ms is not None and tokens > 0 and latency_ms > ttft_ms:
            self.tokens_per_second.append(tokens * 1000 / (latency_ms - ttft_ms))


def measure(
    spec: AnalysisSpec,
    *,
    deployment_id: int,
    region_code: str,
    prometheus_url: str,
    candidate: Side,
    baseline: Side,
    start: datetime,
    end: datetime,
) -> list[Measurement]:
    """Every metric of ``spec`` judged over ``[start, end)``, in the spec's order."""
    if end <= start:
        raise ValueError(f"the window must end after it starts ({start} .. {end})")
    sides = {CANDIDATE: candidate, BASELINE: baseline}
    gateway = [m for m in spec.metrics if m.source == GATEWAY]
    found = gateway_requests(deployment_id, region_code, sides, start, end) if gateway else {}
    where = _records_text(deployment_id, region_code, sides, start, end)
    prometheus = PrometheusReader(prometheus_url, sides, start, end)
    measured = []
    for metric in spec.metrics:
        if metric.source == GATEWAY:
            measured.append(_judge_gateway(metric, spec, found, f"{where}; {GATEWAY_RULES[metric.metric]}"))
        else:
            measured.append(prometheus.judge(metric, spec))
    return measured


def gateway_requests(
    deployment_id: int, region_code: str, sides: dict[str, Side], start: datetime, end: datetime
) -> dict[str, Requests]:
    """Both sides' records in one query: a record counts for the side whose version and track it carries."""
    either = Q(candidate_errors__gt=0)  # whichever revision finally answered, the candidate failed first
    for side in sides.values():
        either |= Q(version=side.version, track__in=side.tracks)
    rows = (
        UsageRecord.objects.filter(
            deployment_id=deployment_id, region=region_code, started_at__gte=start, started_at__lt=end
        )
        .filter(either)
        .values_list(
            "version",
            "track",
            "status",
            "latency_ms",
            "ttft_ms",
            "completion_tokens",
            "stream",
            "candidate_errors",
        )
    )
    found = {name: Requests() for name in sides}
    owner = {(s.version, track): name for name, s in sides.items() for track in s.tracks}
    for version, track, status, latency_ms, ttft_ms, tokens, stream, candidate_errors in rows.iterator():
        found[CANDIDATE].fail(candidate_errors)
        name = owner.get((version, track))
        if name is not None:
            found[name].add(status, latency_ms, ttft_ms, tokens, stream)
    return found


def _judge_gateway(
    metric: MetricSpec, spec: AnalysisSpec, found: dict[str, Requests], query: str
) -> Measurement:
    c, b = found[CANDIDATE], found[BASELINE]
    n, alpha = spec.min_samples, spec.alpha
    if metric.metric == "error_rate":
        return judge_errors(
            metric, c.errors, c.total, b.errors, b.total, min_samples=n, alpha=alpha, query=query
        )
    samples = metric.metric  # ttft, latency or tokens_per_second: a list on Requests
    return judge_latency(
        metric, getattr(c, samples), getattr(b, samples), min_samples=n, alpha=alpha, query=query
    )


def _records_text(
    deployment_id: int, region_code: str, sides: dict[str, Side], start: datetime, end: datetime
) -> str:
    each = "; ".join(
        f"{name}: version={side.version} track in ({', '.join(side.tracks)})" for name, side in sides.items()
    )
    window = f"{start.isoformat()} <= started_at < {end.isoformat()}"
    return f"UsageRecord deployment={deployment_id} region={region_code} {window}; {each}"


class PrometheusReader:
    """vLLM's series for both sides over the window, read at its end: one query per metric."""

    def __init__(self, url: str, sides: dict[str, Side], start: datetime, end: datetime):
        self.url, self.end = url, end
        self.seconds = max(1, math.ceil((end - start).total_seconds()))
        self.side_of = {urlsplit(u).netloc: name for name, side in sides.items() for u in side.endpoints}
        self.missing = [name for name, side in sides.items() if not side.endpoints]
        self.down = "" if url else "the region names no Prometheus"
        timeouts = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, "read_timeout": READ_TIMEOUT_SECONDS}
        self.client = prometheus_client(url, retries=1, **timeouts) if url else None

    def judge(self, metric: MetricSpec, spec: AnalysisSpec) -> Measurement:
        gauge = metric.kind == GAUGE
        query = self.query(metric.metric, gauge=gauge)
        if self.down or self.missing:
            why = self.down or f"no engine endpoints for the {' and '.join(self.missing)}"
            return unmeasured(metric, query, why)
        try:
            result = self.ask(query)
            samples = self.samples(result) if gauge else ([], [])
            buckets = ({}, {}) if gauge else self.buckets(result)
        except (requests.ConnectionError, requests.Timeout) as error:
            self.down = f"Prometheus at {self.url} did not answer: {_short(error)}"
            return unmeasured(metric, query, self.down)
        except (
            PrometheusApiClientException,
            requests.RequestException,
            LookupError,
            TypeError,
            ValueError,
        ) as e:
            return unmeasured(metric, query, f"the Prometheus query failed: {_short(e)}")
        if gauge:
            return judge_gauge(metric, *samples, query=query)
        return judge_histogram(metric, *buckets, min_samples=spec.min_samples, alpha=spec.alpha, query=query)

    def query(self, metric: str, *, gauge: bool) -> str:
        # A raw string (backquotes) in PromQL, so the regular expression's backslashes stay as they are.
        instances = "|".join(re.escape(netloc) for netloc in sorted(self.side_of)) or "none"
        if gauge:  # every sample in the window, one series per engine
            return f"{metric}{{instance=~`{instances}`}}[{self.seconds}s]"
        selector = f"{metric}_bucket{{instance=~`{instances}`}}[{self.seconds}s]"
        return f"sum by (instance, le) (increase({selector}))"

    def ask(self, query: str) -> list[dict[str, Any]]:
        assert self.client, "no Prometheus to ask"
        result = self.client.custom_query(query, params={"time": self.end.timestamp()})
        if not isinstance(result, list):
            raise TypeError(f"unexpected answer {result!r:.200}")
        return result

    def buckets(self, result: Iterable[dict[str, Any]]) -> tuple[dict[float, float], dict[float, float]]:
        found: dict[str, dict[float, float]] = {CANDIDATE: {}, BASELINE: {}}
        for series in result:
            labels = series["metric"]
            if side := self.side_of.get(labels.get("instance", "")):
                le, count = float(labels["le"]), float(series["value"][1])
                found[side][le] = found[side].get(le, 0.0) + (count if math.isfinite(count) else 0.0)
        return found[CANDIDATE], found[BASELINE]

    def samples(self, result: Iterable[dict[str, Any]]) -> tuple[list[float], list[float]]:
        found: dict[str, list[float]] = {CANDIDATE: [], BASELINE: []}
        for series in result:
            if side := self.side_of.get(series["metric"].get("instance", "")):
                found[side] += [float(value) for _, value in series["values"]]
        return found[CANDIDATE], found[BASELINE]


def _short(error: Exception) -> str:
    """The error without the request's URL: the innermost reason urllib3 gives (refused, timed out)."""
    cause = getattr(error.args[0], "reason", None) if error.args else None
    text = str(cause or error) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
