"""Judging one rollout step: candidate against baseline, in the same region and the same time window.

Pure computation (no Django, no I/O): ``rollouts.metrics`` collects the samples, this module turns them
into measurements and a verdict. The rules below are the product's promise to whoever ships a model:

- **Too little traffic is no answer.** Fewer than ``min_samples`` requests on either side (the candidate's
  or the baseline's) makes a metric ``inconclusive``: the rollout pauses and a human decides. For gauges the
  samples are Prometheus scrapes, and at least ``GAUGE_MIN_SCRAPES`` per side are needed.
- **Latency against the baseline** (``max_ratio``): a one-sided Mann–Whitney U test (is the candidate
  slower?). The metric fails only when the difference is significant (p < ``alpha``) *and* the candidate's
  statistic (e.g. p95) exceeds the baseline's × ``max_ratio``. A significant but negligible slowdown
  passes; a large difference of two point estimates that is not significant is noise and passes.
- **Throughput against the baseline** (``min_ratio``, tokens per second): the mirror image, one-sided
  towards "the candidate is slower": fails when significant *and* candidate < baseline × ``min_ratio``.
- **Absolute ceilings** (``max``): fail when the candidate's statistic exceeds it, whatever the baseline.
- **Errors** (``error_rate``: 5xx answers and timeouts; 4xx and a client that went away (499) are not the
  engine's errors): a one-sided Fisher exact test; fails when significant *and* the candidate's rate >
  the baseline's + ``max_increase``, or when the candidate's rate exceeds ``max``.
- **vLLM histograms** from Prometheus: quantiles interpolated inside buckets as ``histogram_quantile``
  does, and the Mann–Whitney U test on the binned observations (each observation stands at its bucket;
  a bucket is one group of ties), so the engine's own measurements get the same statistical rule.
- **Gauges** (waiting requests, KV-cache usage): the mean over the window, thresholds only (``max``,
  ``max_ratio``, ``max_increase``): a gauge is a few scrapes, not independent observations.
- **The step's verdict**: any metric failed → ``failed``; else any inconclusive → ``inconclusive``; else
  ``successful``. No metric measured at all is ``inconclusive``.

The spec is JSON (``parse_spec``); a missing or empty spec is ``DEFAULT_SPEC``.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from scipy.stats import fisher_exact, mannwhitneyu, norm

from core.errors import ValidationFailed

SUCCESSFUL, FAILED, INCONCLUSIVE = "successful", "failed", "inconclusive"
GATEWAY, PROMETHEUS = "gateway", "prometheus"
MANN_WHITNEY_U, FISHER_EXACT, THRESHOLD = "mann_whitney_u", "fisher_exact", "threshold"
QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}
MAX_METRICS = 20
GAUGE_MIN_SCRAPES = 3

# What each kind of metric may be judged by: the statistics it has and the thresholds that mean something.
LATENCY, THROUGHPUT, ERRORS, HISTOGRAM, GAUGE = "latency", "throughput", "errors", "histogram", "gauge"
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    LATENCY: ((*QUANTILES, "mean"), ("max", "max_ratio")),
    THROUGHPUT: ((*QUANTILES, "mean"), ("min_ratio",)),
    ERRORS: (("rate",), ("max", "max_increase")),
    HISTOGRAM: (tuple(QUANTILES), ("max", "max_ratio")),
    GAUGE: (("mean",), ("max", "max_ratio", "max_increase")),
}
DEFAULT_STAT = {LATENCY: "p95", THROUGHPUT: "p50", ERRORS: "rate", HISTOGRAM: "p95", GAUGE: "mean"}
UNITS = {LATENCY: " s", THROUGHPUT: " tok/s", ERRORS: "", HISTOGRAM: " s", GAUGE: ""}
METRICS: dict[tuple[str, str], str] = {
    (GATEWAY, "ttft"): LATENCY,
    (GATEWAY, "latency"): LATENCY,
    (GATEWAY, "tokens_per_second"): THROUGHPUT,
    (GATEWAY, "error_rate"): ERRORS,
    (PROMETHEUS, "vllm:time_to_first_token_seconds"): HISTOGRAM,
    (PROMETHEUS, "vllm:inter_token_latency_seconds"): HISTOGRAM,
    (PROMETHEUS, "vllm:e2e_request_latency_seconds"): HISTOGRAM,
    (PROMETHEUS, "vllm:request_queue_time_seconds"): HISTOGRAM,
    (PROMETHEUS, "vllm:num_requests_waiting"): GAUGE,
    (PROMETHEUS, "vllm:kv_cache_usage_perc"): GAUGE,
}
THRESHOLDS = ("max", "max_ratio", "min_ratio", "max_increase")


class SpecError(ValidationFailed):
    """A malformed analysis spec; ``detail`` maps each field path (``analysis.metrics[0].stat``) to its
    problems, as the API's error envelope carries them."""

    def __init__(self, message: str, detail: dict[str, list[str]]):
        super().__init__(message, detail=detail)


@dataclass(frozen=True)
class MetricSpec:
    """One metric to judge and its thresholds (latencies in seconds, rates as fractions of 1)."""

    metric: str
    source: str
    stat: str
    max: float | None = None  # absolute ceiling on the candidate's statistic
    max_ratio: float | None = None  # candidate ≤ baseline × max_ratio (when significant)
    min_ratio: float | None = None  # throughput: candidate ≥ baseline × min_ratio (when significant)
    max_increase: float | None = None  # candidate ≤ baseline + max_increase

    @property
    def kind(self) -> str:
        return METRICS[(self.source, self.metric)]


@dataclass(frozen=True)
class AnalysisSpec:
    metrics: tuple[MetricSpec, ...]
    min_samples: int = 30
    # Per metric. A rollout runs several tests (metrics × steps × waves): at 0.05 each, too many equal
    # candidates failed somewhere (4 of 90 in bench/rollout_analysis_bench.py; 0 at 0.01).
    alpha: float = 0.01
    quality_gate: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The spec as JSON with every default filled in: what a rollout stores; ``parse_spec`` reads it."""
        metrics = [{k: v for k, v in asdict(m).items() if v is not None} for m in self.metrics]
        return {**asdict(self), "metrics": metrics}


DEFAULT_SPEC = AnalysisSpec(
    metrics=(
        MetricSpec("ttft", GATEWAY, "p95", max_ratio=1.10),
        MetricSpec("error_rate", GATEWAY, "rate", max_increase=0.01),
        MetricSpec("vllm:time_to_first_token_seconds", PROMETHEUS, "p95", max_ratio=1.10),
    )
)


@dataclass(frozen=True)
class Measurement:
    """One metric judged for one step: what was asked, what both sides showed, the test and the verdict."""

    metric: str
    source: str
    stat: str
    query: str
    candidate: float | None
    baseline: float | None
    candidate_samples: int
    baseline_samples: int
    test: str
    statistic: float | None
    p_value: float | None
    threshold: str
    verdict: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: a NaN or infinite number (an odds ratio with no baseline errors) is null."""
        return {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()
        }


def verdict(measurements: Sequence[Measurement]) -> str:
    verdicts = {m.verdict for m in measurements}
    if FAILED in verdicts:
        return FAILED
    return INCONCLUSIVE if INCONCLUSIVE in verdicts or not verdicts else SUCCESSFUL


# --- judging -------------------------------------------------------------------------------------------


def judge_latency(
    spec: MetricSpec,
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    min_samples: int,
    alpha: float,
    query: str,
) -> Measurement:
    """Per-request samples (latencies, TTFT, tokens per second): the statistic and Mann–Whitney U."""
    cand, base = _finite(candidate), _finite(baseline)
    c, b = _stat(cand, spec.stat), _stat(base, spec.stat)
    start = _start(spec, query, c, b, len(cand), len(base), alpha)
    if short := _too_few(len(cand), len(base), min_samples):
        return replace(start, verdict=INCONCLUSIVE, reason=short)
    assert c is not None and b is not None
    if spec.max_ratio is None and spec.min_ratio is None:
        return _decide(start, spec, c, b, significant=False)
    alternative = "greater" if spec.max_ratio is not None else "less"
    result = mannwhitneyu(cand, base, alternative=alternative)
    p = _p(float(result.pvalue))
    start = replace(start, test=MANN_WHITNEY_U, statistic=float(result.statistic), p_value=p)
    return _decide(start, spec, c, b, significant=p < alpha)


def judge_errors(
    spec: MetricSpec,
    candidate_errors: int,
    candidate_total: int,
    baseline_errors: int,
    baseline_total: int,
    *,
    min_samples: int,
    alpha: float,
    query: str,
) -> Measurement:
    """Error counts: each side's rate and a one-sided Fisher exact test (does the candidate fail more?)."""
    for errors, total in ((candidate_errors, candidate_total), (baseline_errors, baseline_total)):
        if not 0 <= errors <= total:
            raise ValueError(f"{errors} errors out of {total} requests")
    c = candidate_errors / candidate_total if candidate_total else None
    b = baseline_errors / baseline_total if baseline_total else None
    start = _start(spec, query, c, b, candidate_total, baseline_total, alpha)
    if short := _too_few(candidate_total, baseline_total, min_samples):
        return replace(start, verdict=INCONCLUSIVE, reason=short)
    assert c is not None and b is not None
    table = [
        [candidate_errors, candidate_total - candidate_errors],
        [baseline_errors, baseline_total - baseline_errors],
    ]
    result = fisher_exact(table, alternative="greater")
    p = _p(float(result.pvalue))
    start = replace(start, test=FISHER_EXACT, statistic=float(result.statistic), p_value=p)
    return _decide(start, spec, c, b, significant=p < alpha)


def judge_histogram(
    spec: MetricSpec,
    candidate_buckets: Mapping[float, float],
    baseline_buckets: Mapping[float, float],
    *,
    min_samples: int,
    alpha: float,
    query: str,
) -> Measurement:
    """Cumulative bucket counts by upper bound (``le``, +Inf included), as ``increase(..._bucket[w])``
    gives them: quantiles as ``histogram_quantile`` computes them, Mann–Whitney U on the binned data."""
    bounds = sorted(set(candidate_buckets) | set(baseline_buckets))
    cand, base = _counts(candidate_buckets, bounds), _counts(baseline_buckets, bounds)
    n_c, n_b = sum(cand), sum(base)
    q = QUANTILES[spec.stat]
    c, b = _histogram_quantile(q, bounds, cand), _histogram_quantile(q, bounds, base)
    start = _start(spec, query, c, b, round(n_c), round(n_b), alpha)
    if short := _too_few(round(n_c), round(n_b), min_samples):
        return replace(start, verdict=INCONCLUSIVE, reason=short)
    assert c is not None and b is not None
    if spec.max_ratio is None:
        return _decide(start, spec, c, b, significant=False)
    statistic, p = binned_mann_whitney_u(cand, base)
    start = replace(start, test=MANN_WHITNEY_U, statistic=statistic, p_value=p)
    return _decide(start, spec, c, b, significant=p < alpha)


def judge_gauge(
    spec: MetricSpec,
    candidate_values: Sequence[float],
    baseline_values: Sequence[float],
    *,
    query: str,
    min_samples: int = GAUGE_MIN_SCRAPES,
) -> Measurement:
    """Gauge samples over the window (waiting requests, KV-cache usage): the means, thresholds only."""
    cand, base = _finite(candidate_values), _finite(baseline_values)
    c, b = _stat(cand, "mean"), _stat(base, "mean")
    start = _start(spec, query, c, b, len(cand), len(base), alpha=None)
    if short := _too_few(len(cand), len(base), min_samples, what="scrapes"):
        return replace(start, verdict=INCONCLUSIVE, reason=short)
    assert c is not None and b is not None
    return _decide(start, spec, c, b, significant=True)


def unmeasured(spec: MetricSpec, query: str, reason: str) -> Measurement:
    """A metric that could not be measured (Prometheus down, no endpoints): inconclusive, saying why."""
    return replace(_start(spec, query, None, None, 0, 0, alpha=None), verdict=INCONCLUSIVE, reason=reason)


def binned_mann_whitney_u(candidate: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """(U of the candidate, one-sided p that it is stochastically greater) from counts per ordered bucket.

    Every observation in a bucket shares the bucket's midrank, so this is the Mann–Whitney U of the binned
    data with its ties, by the normal approximation with tie correction and continuity correction, exactly
    what ``scipy.stats.mannwhitneyu(method="asymptotic")`` gives on the expanded samples, in time linear in
    the number of buckets rather than in the number of requests (counts from ``increase()`` are fractional).
    """
    n_c, n_b = sum(candidate), sum(baseline)
    n = n_c + n_b
    below = rank_sum = ties = 0.0
    for c, b in zip(candidate, baseline, strict=True):
        t = c + b
        rank_sum += c * (below + (t + 1) / 2)
        ties += t**3 - t
        below += t
    u = rank_sum - n_c * (n_c + 1) / 2
    variance = n_c * n_b / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return u, 1.0  # every observation in one bucket: nothing tells the sides apart
    z = (u - n_c * n_b / 2 - 0.5) / math.sqrt(variance)
    return u, float(norm.sf(z))


# --- the pieces ----------------------------------------------------------------------------------------


def _start(
    spec: MetricSpec,
    query: str,
    c: float | None,
    b: float | None,
    n_c: int,
    n_b: int,
    alpha: float | None,
) -> Measurement:
    return Measurement(
        metric=spec.metric,
        source=spec.source,
        stat=spec.stat,
        query=query,
        candidate=c,
        baseline=b,
        candidate_samples=n_c,
        baseline_samples=n_b,
        test=THRESHOLD,
        statistic=None,
        p_value=None,
        threshold=threshold_text(spec, alpha),
        verdict=INCONCLUSIVE,
        reason="",
    )


def _decide(start: Measurement, spec: MetricSpec, c: float, b: float, *, significant: bool) -> Measurement:
    """Apply every threshold of ``spec``; the relative ones only when the difference is ``significant``."""
    unit, s = UNITS[spec.kind], spec.stat
    failures, notes = [], []
    if spec.max is not None and c > spec.max:
        failures.append(f"candidate {s} {_num(c, unit)} exceeds the ceiling {_num(spec.max, unit)}")
    relative = [
        (spec.max_ratio, b * (spec.max_ratio or 0), c > b * (spec.max_ratio or 0), "above"),
        (spec.min_ratio, b * (spec.min_ratio or 0), c < b * (spec.min_ratio or 0), "below"),
        (spec.max_increase, b + (spec.max_increase or 0), c > b + (spec.max_increase or 0), "above"),
    ]
    for limit, bound, beyond, side in relative:
        if limit is None or not beyond:
            continue
        said = f"candidate {s} {_num(c, unit)} is {side} {_num(bound, unit)} (baseline {_num(b, unit)})"
        if significant:
            failures.append(said + (f", p {start.p_value:.2g}" if start.p_value is not None else ""))
        else:
            p = f" (p {start.p_value:.2g})" if start.p_value is not None else ""
            notes.append(f"{said}, but the difference is not significant{p}")
    if failures:
        return replace(start, verdict=FAILED, reason="; ".join(failures))
    reason = "; ".join(notes) or f"candidate {s} {_num(c, unit)}, baseline {_num(b, unit)}: within thresholds"
    return replace(start, verdict=SUCCESSFUL, reason=reason)


def threshold_text(spec: MetricSpec, alpha: float | None) -> str:
    unit, s = UNITS[spec.kind], spec.stat
    parts = []
    if spec.max is not None:
        parts.append(f"{s} ≤ {_num(spec.max, unit)}")
    tested = f" when significant (α {alpha:g})" if alpha is not None else ""
    if spec.max_ratio is not None:
        parts.append(f"{s} ≤ baseline × {spec.max_ratio:g}{tested}")
    if spec.min_ratio is not None:
        parts.append(f"{s} ≥ baseline × {spec.min_ratio:g}{tested}")
    if spec.max_increase is not None:
        parts.append(f"{s} ≤ baseline + {spec.max_increase:g}{tested}")
    return "; ".join(parts)


def _too_few(n_c: int, n_b: int, needed: int, what: str = "requests") -> str:
    if n_c >= needed and n_b >= needed:
        return ""
    sides = f"{n_c} candidate and {n_b} baseline {what}"
    return f"too little traffic to judge: {sides}, {needed} needed on each side"


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if math.isfinite(v)]


def _p(p: float) -> float:
    return p if math.isfinite(p) else 1.0  # all ties: no evidence either way


def _num(value: float, unit: str) -> str:
    return f"{value:.4g}{unit}"


def _stat(values: Sequence[float], stat: str) -> float | None:
    """The mean, or a quantile interpolated linearly between order statistics (numpy's default)."""
    if not values:
        return None
    if stat == "mean":
        return math.fsum(values) / len(values)
    ordered = sorted(values)
    position = (len(ordered) - 1) * QUANTILES[stat]
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _counts(cumulative: Mapping[float, float], bounds: Sequence[float]) -> list[float]:
    """Per-bucket counts from cumulative ones. A bound one side lacks takes the count below it; counts
    that fall (``increase()`` extrapolates each bucket on its own) are held level, as
    ``histogram_quantile`` does."""
    counts, level = [], 0.0
    for le in bounds:
        now = max(level, float(cumulative.get(le, level)))
        counts.append(now - level)
        level = now
    return counts


def _histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """Prometheus's ``histogram_quantile``: linear inside the bucket holding rank q × n, the lowest bucket
    starting at 0, the +Inf bucket answered by the highest finite bound."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, below, lower = q * total, 0.0, 0.0
    for le, count in zip(bounds, counts, strict=True):
        if below + count >= rank and count > 0:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / count
        below += count
        lower = le if math.isfinite(le) else lower
    return lower


# --- the spec ------------------------------------------------------------------------------------------


def parse_spec(raw: object) -> AnalysisSpec:
    """The analysis spec from JSON; every problem found is named by its field path in ``SpecError``."""
    if raw is None or raw == {}:
        return DEFAULT_SPEC
    errors: dict[str, list[str]] = {}
    if not isinstance(raw, dict):
        _fail({"analysis": ["must be an object"]})
    assert isinstance(raw, dict)
    for key in sorted(set(raw) - {"metrics", "min_samples", "alpha", "quality_gate"}, key=str):
        errors.setdefault(f"analysis.{key}", []).append("unknown field")
    min_samples = _number(raw, "min_samples", 30, errors, integer=True, low=1, high=1_000_000)
    alpha = _number(raw, "alpha", 0.01, errors, low=0.0, high=0.5, open_low=True)
    quality_gate = raw.get("quality_gate", False)
    if not isinstance(quality_gate, bool):
        errors.setdefault("analysis.quality_gate", []).append("must be true or false")
    metrics = _metrics(raw.get("metrics"), errors)
    if errors:
        _fail(errors)
    return AnalysisSpec(
        metrics=metrics, min_samples=int(min_samples or 0), alpha=float(alpha or 0), quality_gate=quality_gate
    )


def _fail(errors: dict[str, list[str]]) -> None:
    summary = "; ".join(f"{field}: {', '.join(problems)}" for field, problems in errors.items())
    raise SpecError(f"Invalid analysis spec: {summary}", errors)


def _metrics(raw: object, errors: dict[str, list[str]]) -> tuple[MetricSpec, ...]:
    if raw is None:
        return DEFAULT_SPEC.metrics
    if not isinstance(raw, list) or not raw:
        errors["analysis.metrics"] = ["must be a non-empty list (leave it out for the default metrics)"]
        return ()
    if len(raw) > MAX_METRICS:
        errors["analysis.metrics"] = [f"at most {MAX_METRICS} metrics, got {len(raw)}"]
        return ()
    parsed: list[MetricSpec] = []
    for n, item in enumerate(raw):
        metric = _metric(item, f"analysis.metrics[{n}]", errors)
        if metric and any(
            (m.source, m.metric, m.stat) == (metric.source, metric.metric, metric.stat) for m in parsed
        ):
            errors.setdefault(f"analysis.metrics[{n}]", []).append("the same metric and stat twice")
        elif metric:
            parsed.append(metric)
    return tuple(parsed)


def _metric(raw: object, path: str, errors: dict[str, list[str]]) -> MetricSpec | None:
    if not isinstance(raw, dict):
        errors[path] = ["must be an object"]
        return None
    raw = {k: v for k, v in raw.items() if not (k in THRESHOLDS and v is None)}  # null: not set (asdict's)
    for key in sorted(set(raw) - {"metric", "source", "stat", *THRESHOLDS}, key=str):
        errors.setdefault(f"{path}.{key}", []).append("unknown field")
    name, source = raw.get("metric"), raw.get("source")
    sources = [s for s, m in METRICS if m == name]
    if not isinstance(name, str) or not sources:
        known = ", ".join(sorted({m for _, m in METRICS}))
        errors.setdefault(f"{path}.metric", []).append(f"unknown metric {name!r}; known: {known}")
        return None
    if source is None:
        source = sources[0]
    elif source not in sources:
        errors.setdefault(f"{path}.source", []).append(f"{name} comes from {sources[0]}, not {source!r}")
        return None
    kind = METRICS[(source, name)]
    stats, allowed = KINDS[kind]
    stat = raw.get("stat", DEFAULT_STAT[kind])
    if stat not in stats:
        errors.setdefault(f"{path}.stat", []).append(f"must be one of {', '.join(stats)} for {name}")
    if not any(key in raw for key in THRESHOLDS):
        errors.setdefault(path, []).append(f"names no threshold; {name} takes {', '.join(allowed)}")
    limits = {key: _threshold(raw, key, kind, allowed, path, errors) for key in THRESHOLDS}
    return MetricSpec(name, source, str(stat), **limits)


def _threshold(
    raw: dict[str, Any], key: str, kind: str, allowed: Sequence[str], path: str, errors: dict[str, list[str]]
) -> float | None:
    if key not in raw:
        return None
    if key not in allowed:
        errors.setdefault(f"{path}.{key}", []).append(
            f"not a threshold of this metric (takes {', '.join(allowed)})"
        )
        return None
    bounds = {  # (low, high) allowed
        "max": (0.0, 1.0 if kind == ERRORS else math.inf),
        "max_ratio": (1.0, 100.0),  # below 1 would demand a faster candidate, not cap a slower one
        "min_ratio": (0.0, 1.0),
        "max_increase": (0.0, 1.0 if kind == ERRORS else math.inf),
    }[key]
    value = _number(
        raw, key, None, errors, low=bounds[0], high=bounds[1], prefix=path, open_low=key == "min_ratio"
    )
    return None if value is None else float(value)


def _number(
    raw: dict[str, Any],
    key: str,
    default: float | None,
    errors: dict[str, list[str]],
    *,
    low: float,
    high: float,
    integer: bool = False,
    open_low: bool = False,
    prefix: str = "analysis",
) -> float | None:
    value = raw.get(key, default)
    field = f"{prefix}.{key}"
    if value is None:
        if key in raw:
            errors.setdefault(field, []).append("must be a number")
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        errors.setdefault(field, []).append("must be an integer" if integer else "must be a number")
        return None
    if not math.isfinite(value):
        errors.setdefault(field, []).append("must be a finite number")
        return None
    if value < low or (open_low and value == low) or value > high:
        lower = f"above {low:g}" if open_low else f"at least {low:g}"
        upper = f" and at most {high:g}" if math.isfinite(high) else ""
        errors.setdefault(field, []).append(f"must be {lower}{upper}, got {value:g}")
        return None
    return value
