"""Validation policies: the rules a version's evaluation must meet, and the server's verdict.

A rule names a metric and any of: ``min``, ``max``, ``max_regression_pct`` (against the current
production version's last passing report; ``higher_is_better`` says which way is a regression). The
client only posts numbers; pass or fail is decided here, with a reason per rule.
"""

from dataclasses import asdict, dataclass
from typing import Any

from core.errors import ValidationFailed

PERFORMANCE_METRICS = {
    "ttft_p95_ms": "time to first token, 95th percentile, milliseconds",
    "itl_p95_ms": "inter-token latency, 95th percentile, milliseconds",
    "output_tokens_per_s": "output tokens per second",
}
RULE_KEYS = {"metric", "min", "max", "max_regression_pct", "higher_is_better"}


@dataclass(frozen=True)
class Rule:
    metric: str
    min: float | None = None
    max: float | None = None
    max_regression_pct: float | None = None
    higher_is_better: bool = True


@dataclass(frozen=True)
class RuleResult:
    metric: str
    value: float | None
    baseline: float | None
    passed: bool
    reason: str
    rule: dict[str, Any]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed(f"{where} must be a number; got {value!r}.")
    return float(value)


def parse_rule(raw: Any, index: int) -> Rule:
    where = f"validation_policy[{index}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("metric"), str) or not raw["metric"]:
        raise ValidationFailed(f"{where} must be an object with a metric name.")
    unknown = set(raw) - RULE_KEYS
    if unknown:
        raise ValidationFailed(f"{where} has unknown key(s) {', '.join(sorted(unknown))}.")
    bounds = {
        key: _number(raw[key], f"{where}.{key}") for key in ("min", "max", "max_regression_pct") if key in raw
    }
    if not bounds:
        raise ValidationFailed(f"{where} ({raw['metric']}) needs min, max or max_regression_pct.")
    if bounds.get("max_regression_pct", 0) < 0:
        raise ValidationFailed(f"{where}.max_regression_pct must not be negative.")
    higher = raw.get("higher_is_better", raw["metric"] not in {"ttft_p95_ms", "itl_p95_ms"})
    if not isinstance(higher, bool):
        raise ValidationFailed(f"{where}.higher_is_better must be true or false.")
    return Rule(metric=raw["metric"][:100], higher_is_better=higher, **bounds)


def parse_policy(raw: Any) -> list[Rule]:
    if not isinstance(raw, list):
        raise ValidationFailed("validation_policy must be a list of rules.")
    return [parse_rule(item, index) for index, item in enumerate(raw)]


def parse_metrics(raw: Any, field: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ValidationFailed(f"{field} must be an object of metric names to numbers.")
    return {str(name)[:100]: _number(value, f"{field}.{name}") for name, value in raw.items()}


def _regression_pct(rule: Rule, value: float, baseline: float) -> float:
    change = (baseline - value) if rule.higher_is_better else (value - baseline)
    return change / abs(baseline) * 100


def evaluate_rule(rule: Rule, value: float | None, baseline: float | None) -> RuleResult:
    def result(passed: bool, reason: str) -> RuleResult:
        return RuleResult(rule.metric, value, baseline, passed, reason, asdict(rule))

    if value is None:
        return result(False, "metric not reported")
    if rule.min is not None and value < rule.min:
        return result(False, f"{value:g} is below the minimum {rule.min:g}")
    if rule.max is not None and value > rule.max:
        return result(False, f"{value:g} is above the maximum {rule.max:g}")
    if rule.max_regression_pct is not None:
        if baseline is None or baseline == 0:
            return result(True, "no production baseline to compare against; regression not checked")
        regression = _regression_pct(rule, value, baseline)
        if regression > rule.max_regression_pct:
            return result(
                False,
                f"{regression:.2f}% worse than production ({baseline:g}); "
                f"at most {rule.max_regression_pct:g}% allowed",
            )
        return result(
            True, f"within {rule.max_regression_pct:g}% of production ({baseline:g}): {regression:+.2f}%"
        )
    return result(True, "within bounds")


def evaluate(
    rules: list[Rule], values: dict[str, float], baseline: dict[str, float] | None
) -> list[RuleResult]:
    return [evaluate_rule(rule, values.get(rule.metric), (baseline or {}).get(rule.metric)) for rule in rules]
