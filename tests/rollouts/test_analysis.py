"""The verdict rules on synthetic samples: a real regression fails, noise passes, too little traffic asks a
human; the same rules on vLLM's binned histograms; and every malformed spec refused with its field named."""

import json
import math
import random
from dataclasses import asdict

import pytest
from scipy.stats import mannwhitneyu

from core.errors import ValidationFailed
from rollouts.analysis import (
    DEFAULT_SPEC,
    FAILED,
    GATEWAY,
    INCONCLUSIVE,
    MANN_WHITNEY_U,
    PROMETHEUS,
    SUCCESSFUL,
    AnalysisSpec,
    Measurement,
    MetricSpec,
    SpecError,
    binned_mann_whitney_u,
    judge_errors,
    judge_gauge,
    judge_histogram,
    judge_latency,
    parse_spec,
    verdict,
)

TTFT = MetricSpec("ttft", GATEWAY, "p95", max_ratio=1.10)
VLLM_TTFT = MetricSpec("vllm:time_to_first_token_seconds", PROMETHEUS, "p95", max_ratio=1.10)
ERRORS = MetricSpec("error_rate", GATEWAY, "rate", max_increase=0.01)
# vLLM's time-to-first-token bucket bounds (vllm/v1/metrics/buckets.py), +Inf last.
VLLM_TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0),
    *(40.0, 80.0, 160.0, 640.0, 2560.0, math.inf),
)
SEEDS = range(50)
TESTS = {"min_samples": 30, "alpha": 0.05, "query": "synthetic"}


def ttfts(
    seed: int, n: int = 200, slower: float = 1.0, sigma: float = 0.25
) -> tuple[list[float], list[float]]:
    """(candidate, baseline): lognormal TTFTs around 0.3 s, the candidate's ``slower`` times longer."""
    rng = random.Random(seed)
    baseline = [rng.lognormvariate(math.log(0.3), sigma) for _ in range(n)]
    return [slower * rng.lognormvariate(math.log(0.3), sigma) for _ in range(n)], baseline


def binned(samples: list[float]) -> dict[float, float]:
    """Cumulative counts by ``le``, as Prometheus's increase(..._bucket[w]) gives them."""
    return {le: float(sum(1 for s in samples if s <= le)) for le in VLLM_TTFT_BUCKETS}


def test_a_20_percent_ttft_regression_with_200_samples_per_side_fails():
    candidate, baseline = ttfts(seed=1, slower=1.2)
    judged = judge_latency(TTFT, candidate, baseline, **TESTS)
    assert judged.verdict == FAILED, judged
    assert judged.test == MANN_WHITNEY_U and judged.p_value < 0.001
    assert judged.candidate > judged.baseline * 1.10
    assert (judged.candidate_samples, judged.baseline_samples) == (200, 200)
    assert "p95" in judged.reason and "above" in judged.reason
    caught = sum(judge_latency(TTFT, *ttfts(seed, slower=1.2), **TESTS).verdict == FAILED for seed in SEEDS)
    assert caught >= 46, caught  # 49 of 50 seen (95 % over 500 seeds); the misses are p95's own noise


def test_two_draws_from_one_distribution_pass_nearly_always():
    judged = [judge_latency(TTFT, *ttfts(seed), **TESTS) for seed in SEEDS]
    false_failures = sum(m.verdict == FAILED for m in judged)
    assert false_failures <= 3, (
        false_failures
    )  # 2 of 50 seen (0.8 % over 500 seeds): alpha 0.05 and the ratio
    assert {m.verdict for m in judged} <= {SUCCESSFUL, FAILED}


def test_too_little_traffic_is_inconclusive_whatever_the_numbers():
    candidate, baseline = ttfts(seed=2, n=10, slower=3.0)
    judged = judge_latency(TTFT, candidate, baseline, **TESTS)
    assert judged.verdict == INCONCLUSIVE and judged.p_value is None
    assert "10 candidate and 10 baseline requests, 30 needed" in judged.reason
    assert judged.candidate is not None and judged.baseline is not None  # still shown to the human
    candidate, baseline = ttfts(seed=2, n=200)
    assert judge_latency(TTFT, candidate, baseline[:29], **TESTS).verdict == INCONCLUSIVE  # either side


def test_a_significant_but_negligible_slowdown_passes():
    candidate, baseline = ttfts(seed=3, n=5000, slower=1.03)
    judged = judge_latency(TTFT, candidate, baseline, **TESTS)
    assert judged.p_value < 0.05 and judged.verdict == SUCCESSFUL, judged


def test_a_big_point_difference_that_is_not_significant_passes():
    _, baseline = ttfts(seed=4, n=40)
    candidate = [*sorted(baseline)[:-3], 2.0, 2.5, 3.0]  # the same, but three slow outliers: p95 moves a lot
    judged = judge_latency(TTFT, candidate, baseline, **TESTS)
    assert judged.candidate > judged.baseline * 1.5 and judged.p_value >= 0.05
    assert judged.verdict == SUCCESSFUL and "not significant" in judged.reason, judged


def test_an_absolute_ceiling_fails_the_candidate_over_it_even_when_no_worse_than_the_baseline():
    spec = MetricSpec("ttft", GATEWAY, "p95", max=0.4)
    candidate, baseline = ttfts(seed=5)
    judged = judge_latency(spec, candidate, baseline, **TESTS)
    assert judged.candidate > 0.4 and judged.verdict == FAILED and "ceiling 0.4 s" in judged.reason
    assert judged.test == "threshold"
    median = MetricSpec("ttft", GATEWAY, "p50", max=0.4)
    assert judge_latency(median, candidate, baseline, **TESTS).verdict == SUCCESSFUL


def test_throughput_fails_when_significantly_below_the_baseline_times_min_ratio():
    spec = MetricSpec("tokens_per_second", GATEWAY, "p50", min_ratio=0.9)
    fast, slow = ttfts(seed=6, slower=1.25)  # read as tokens per second: the "baseline" is 20 % slower
    assert judge_latency(spec, slow, fast, **TESTS).verdict == FAILED
    assert judge_latency(spec, fast, slow, **TESTS).verdict == SUCCESSFUL  # a faster candidate is fine
    assert judge_latency(spec, *ttfts(seed=6), **TESTS).verdict == SUCCESSFUL


def test_errors_fail_on_a_significant_increase_and_not_on_noise():
    judged = judge_errors(ERRORS, 12, 200, 0, 200, **TESTS)
    assert judged.verdict == FAILED and judged.p_value < 0.001 and judged.test == "fisher_exact"
    assert (judged.candidate, judged.baseline) == (0.06, 0.0)
    assert judge_errors(ERRORS, 2, 200, 1, 200, **TESTS).verdict == SUCCESSFUL
    assert judge_errors(ERRORS, 0, 200, 12, 200, **TESTS).verdict == SUCCESSFUL  # fewer errors than before
    assert judge_errors(ERRORS, 5, 20, 0, 200, **TESTS).verdict == INCONCLUSIVE


def test_an_error_rate_ceiling_fails_without_a_test():
    spec = MetricSpec("error_rate", GATEWAY, "rate", max=0.01)
    assert judge_errors(spec, 3, 200, 3, 200, **TESTS).verdict == FAILED
    assert judge_errors(spec, 2, 200, 3, 200, **TESTS).verdict == SUCCESSFUL
    with pytest.raises(ValueError):
        judge_errors(spec, 201, 200, 0, 200, **TESTS)


def test_the_histogram_version_of_the_20_percent_regression_fails_and_one_distribution_passes():
    judged = judge_histogram(VLLM_TTFT, *map(binned, ttfts(seed=1, slower=1.2)), **TESTS)
    assert judged.verdict == FAILED and judged.test == MANN_WHITNEY_U, judged
    assert (judged.candidate_samples, judged.baseline_samples) == (200, 200)
    caught = sum(
        judge_histogram(VLLM_TTFT, *map(binned, ttfts(seed, slower=1.2)), **TESTS).verdict == FAILED
        for seed in SEEDS
    )
    assert caught >= 46, caught  # 50 of 50 seen (96 % over 500 seeds)
    false_failures = sum(
        judge_histogram(VLLM_TTFT, *map(binned, ttfts(seed)), **TESTS).verdict == FAILED for seed in SEEDS
    )
    assert false_failures <= 3, false_failures  # none of 50 seen (none of 500)


def test_histogram_quantiles_interpolate_inside_the_bucket_as_prometheus_does():
    buckets = {0.1: 0.0, 0.25: 50.0, 0.5: 100.0, math.inf: 100.0}
    spec = MetricSpec("vllm:time_to_first_token_seconds", PROMETHEUS, "p90", max=10.0)
    p50 = MetricSpec("vllm:time_to_first_token_seconds", PROMETHEUS, "p50", max=10.0)
    assert judge_histogram(spec, buckets, buckets, **TESTS).candidate == pytest.approx(0.45)
    assert judge_histogram(p50, buckets, buckets, **TESTS).candidate == pytest.approx(0.25)
    beyond = {0.1: 10.0, 0.25: 20.0, math.inf: 100.0}  # the quantile in +Inf: the highest finite bound
    assert judge_histogram(spec, beyond, beyond, **TESTS).candidate == 0.25
    falling = {0.1: 40.0, 0.25: 39.5, 0.5: 80.0, math.inf: 80.0}  # increase() extrapolates each bucket
    assert judge_histogram(p50, falling, falling, **TESTS).candidate == pytest.approx(0.1)


def test_the_binned_mann_whitney_u_is_scipys_on_the_expanded_samples():
    rng = random.Random(7)
    candidate = [rng.randrange(0, 40) for _ in range(len(VLLM_TTFT_BUCKETS))]
    baseline = [rng.randrange(0, 40) for _ in range(len(VLLM_TTFT_BUCKETS))]
    expanded_c = [i for i, n in enumerate(candidate) for _ in range(n)]
    expanded_b = [i for i, n in enumerate(baseline) for _ in range(n)]
    expected = mannwhitneyu(expanded_c, expanded_b, alternative="greater", method="asymptotic")
    u, p = binned_mann_whitney_u(candidate, baseline)
    assert u == pytest.approx(expected.statistic) and p == pytest.approx(expected.pvalue, rel=1e-9)
    assert binned_mann_whitney_u([0, 50, 0], [0, 70, 0]) == (pytest.approx(1750.0), 1.0)  # all tied


def test_gauges_are_judged_on_their_mean_by_thresholds_only():
    waiting = MetricSpec("vllm:num_requests_waiting", PROMETHEUS, "mean", max=2.0, max_increase=1.0)
    judged = judge_gauge(waiting, [3.0, 3.0, 4.0], [0.0, 0.0, 0.0], query="q")
    assert judged.verdict == FAILED and judged.candidate == pytest.approx(10 / 3) and judged.p_value is None
    assert "ceiling 2" in judged.reason and "above 1" in judged.reason
    assert judge_gauge(waiting, [0.0, 1.0, 0.5], [0.0, 0.0, 0.0], query="q").verdict == SUCCESSFUL
    assert judge_gauge(waiting, [9.0, 9.0], [0.0, 0.0, 0.0], query="q").verdict == INCONCLUSIVE  # 2 scrapes


def test_the_step_verdict_fails_on_any_failure_then_waits_on_any_inconclusive():
    ok = judge_errors(ERRORS, 1, 200, 1, 200, **TESTS)
    bad = judge_errors(ERRORS, 30, 200, 1, 200, **TESTS)
    unsure = judge_errors(ERRORS, 1, 2, 1, 2, **TESTS)
    assert verdict([ok, ok]) == SUCCESSFUL
    assert verdict([ok, unsure]) == INCONCLUSIVE
    assert verdict([unsure, bad, ok]) == FAILED
    assert verdict([]) == INCONCLUSIVE


def test_a_measurement_is_json_without_nan():
    judged = judge_errors(ERRORS, 12, 200, 0, 200, **TESTS)
    assert judged.statistic == math.inf  # Fisher's odds ratio with no baseline error
    stored = json.loads(json.dumps(judged.as_dict(), allow_nan=False))
    assert stored["statistic"] is None and stored["verdict"] == FAILED
    assert set(stored) == set(Measurement.__dataclass_fields__)
    assert "+ 0.01 when significant (α 0.05)" in stored["threshold"]


# --- the spec ------------------------------------------------------------------------------------------


def test_a_missing_or_empty_spec_is_the_default_and_a_spec_round_trips():
    assert parse_spec(None) == parse_spec({}) == DEFAULT_SPEC
    assert [(m.source, m.metric, m.stat) for m in DEFAULT_SPEC.metrics] == [
        ("gateway", "ttft", "p95"),
        ("gateway", "error_rate", "rate"),
        ("prometheus", "vllm:time_to_first_token_seconds", "p95"),
    ]
    assert parse_spec({"min_samples": 100}) == AnalysisSpec(DEFAULT_SPEC.metrics, min_samples=100)
    spec = parse_spec(
        {
            "metrics": [
                {"metric": "ttft", "max": 0.8, "max_ratio": 1.1},
                {"metric": "vllm:num_requests_waiting", "max_increase": 2},
                {"metric": "tokens_per_second", "stat": "mean", "min_ratio": 0.9},
            ],
            "alpha": 0.01,
            "quality_gate": True,
        }
    )
    assert spec.metrics[0] == MetricSpec("ttft", GATEWAY, "p95", max=0.8, max_ratio=1.1)
    assert spec.metrics[1] == MetricSpec("vllm:num_requests_waiting", PROMETHEUS, "mean", max_increase=2.0)
    assert (spec.alpha, spec.min_samples, spec.quality_gate) == (0.01, 30, True)
    assert parse_spec(json.loads(json.dumps(spec.as_dict()))) == spec
    assert parse_spec(json.loads(json.dumps(asdict(spec)))) == spec  # a threshold that is null is not set


TTFT_RAW = {"metric": "ttft", "max_ratio": 1.1}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([TTFT_RAW], "analysis"),
        ({"metrics": [TTFT_RAW], "window": 60}, "analysis.window"),
        ({"min_samples": True}, "analysis.min_samples"),
        ({"min_samples": 30.5}, "analysis.min_samples"),
        ({"min_samples": 0}, "analysis.min_samples"),
        ({"min_samples": "30"}, "analysis.min_samples"),
        ({"alpha": float("nan")}, "analysis.alpha"),
        ({"alpha": float("inf")}, "analysis.alpha"),
        ({"alpha": 0}, "analysis.alpha"),
        ({"alpha": 0.7}, "analysis.alpha"),
        ({"alpha": None}, "analysis.alpha"),
        ({"quality_gate": "yes"}, "analysis.quality_gate"),
        ({"metrics": []}, "analysis.metrics"),
        ({"metrics": TTFT_RAW}, "analysis.metrics"),
        ({"metrics": [TTFT_RAW] * 21}, "analysis.metrics"),
        ({"metrics": ["ttft"]}, "analysis.metrics[0]"),
        ({"metrics": [{"metric": "ttfb", "max": 1}]}, "analysis.metrics[0].metric"),
        ({"metrics": [{"max": 1}]}, "analysis.metrics[0].metric"),
        ({"metrics": [{**TTFT_RAW, "source": "prometheus"}]}, "analysis.metrics[0].source"),
        ({"metrics": [{**TTFT_RAW, "stat": "p42"}]}, "analysis.metrics[0].stat"),
        ({"metrics": [{**TTFT_RAW, "stat": "rate"}]}, "analysis.metrics[0].stat"),
        (
            {"metrics": [{"metric": "vllm:time_to_first_token_seconds", "stat": "mean", "max": 1}]},
            "analysis.metrics[0].stat",
        ),
        ({"metrics": [{**TTFT_RAW, "maxratio": 1.2}]}, "analysis.metrics[0].maxratio"),
        ({"metrics": [{"metric": "ttft", "max_ratio": 0.9}]}, "analysis.metrics[0].max_ratio"),
        ({"metrics": [{"metric": "ttft", "max_ratio": True}]}, "analysis.metrics[0].max_ratio"),
        ({"metrics": [{"metric": "ttft", "max": -0.1}]}, "analysis.metrics[0].max"),
        ({"metrics": [{"metric": "ttft", "max": float("inf")}]}, "analysis.metrics[0].max"),
        ({"metrics": [{"metric": "ttft", "max": "800ms"}]}, "analysis.metrics[0].max"),
        ({"metrics": [{"metric": "ttft", "min_ratio": 0.9}]}, "analysis.metrics[0].min_ratio"),
        ({"metrics": [{"metric": "tokens_per_second", "min_ratio": 1.5}]}, "analysis.metrics[0].min_ratio"),
        ({"metrics": [{"metric": "tokens_per_second", "min_ratio": 0}]}, "analysis.metrics[0].min_ratio"),
        ({"metrics": [{"metric": "error_rate", "max": 1.5}]}, "analysis.metrics[0].max"),
        ({"metrics": [{"metric": "error_rate", "max_increase": -0.01}]}, "analysis.metrics[0].max_increase"),
        ({"metrics": [{"metric": "error_rate", "max_ratio": 2}]}, "analysis.metrics[0].max_ratio"),
        ({"metrics": [{"metric": "ttft"}]}, "analysis.metrics[0]"),
        ({"metrics": [TTFT_RAW, {"metric": "ttft", "max": 1}]}, "analysis.metrics[1]"),
    ],
)
def test_a_malformed_spec_is_refused_with_the_field_named(raw, field):
    with pytest.raises(SpecError) as refused:
        parse_spec(raw)
    assert field in refused.value.detail, refused.value.detail
    assert isinstance(refused.value, ValidationFailed) and refused.value.status == 400
    assert field in refused.value.message


def test_every_problem_of_a_spec_is_named_at_once():
    with pytest.raises(SpecError) as refused:
        parse_spec({"alpha": 2, "metrics": [{"metric": "ttft", "stat": "p1", "max": -1}, {"metric": "x"}]})
    assert set(refused.value.detail) == {
        "analysis.alpha",
        "analysis.metrics[0].stat",
        "analysis.metrics[0].max",
        "analysis.metrics[1].metric",
    }
