"""A rollout's plan: the steps each wave runs and the waves of regions, checked before anything is written.

Steps are small JSON objects, one key each:

- ``{"set_weight": 25}``: the candidate takes 25 % of the wave's requests (canary; weights only grow);
- ``{"set_mirror": 20}``: 20 % of the wave's requests are copied to the candidate (shadow);
- ``{"pause": {"seconds": 120, "min_requests": 200}}``: wait until both hold, then judge the step by an
  analysis run in every region of the wave; ``{"pause": {}}`` waits for a person to resume, unjudged.
  ``"warmup_seconds": 15`` leaves the step's first seconds out of the analysis window and the request
  count (as Kayenta's "begin analysis after" and Argo's ``initialDelay`` do): engines whose load just
  changed answer slower for a while, whichever version they run.

Blue-green plans hold pauses only: the candidate runs at full size beside the baseline, reachable as a
preview, and takes 100 % in one route-table generation when the wave's plan is done. Canary and blue-green
waves end at 100 % before the next wave starts; shadow waves keep mirroring until the last one is done.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.choices import Strategy

MAX_STEPS = 50
MAX_PAUSE_SECONDS = 7 * 24 * 3600
MAX_MIN_REQUESTS = 10_000_000
STEP_KINDS: dict[str, frozenset[str]] = {
    Strategy.CANARY: frozenset({"set_weight", "pause"}),
    Strategy.BLUE_GREEN: frozenset({"pause"}),
    Strategy.SHADOW: frozenset({"set_mirror", "pause"}),
}
JUDGED_PAUSE = {"seconds": 60, "min_requests": 30}
PAUSE_FIELDS = frozenset({"seconds", "min_requests", "warmup_seconds"})
DEFAULT_STEPS: dict[str, list[dict[str, Any]]] = {
    Strategy.CANARY: [
        {"set_weight": 10},
        {"pause": JUDGED_PAUSE},
        {"set_weight": 50},
        {"pause": JUDGED_PAUSE},
    ],
    Strategy.BLUE_GREEN: [{"pause": JUDGED_PAUSE}],
    Strategy.SHADOW: [{"set_mirror": 50}, {"pause": JUDGED_PAUSE}],
}


class PlanError(ValueError):
    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message, self.field = message, field


@dataclass(frozen=True)
class Pause:
    seconds: int | None
    min_requests: int
    warmup_seconds: int = 0

    @property
    def judged(self) -> bool:
        """A timed or counted pause ends in an analysis run; an open one waits for a person."""
        return self.seconds is not None or self.min_requests > 0


def _whole(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError(f"{field} must be a whole number from {low} to {high}.", "steps")
    return value


def _step(raw: Any, index: int, strategy: str, last_weight: int) -> dict[str, Any]:
    where = f"step {index + 1}"
    if not isinstance(raw, dict) or len(raw) != 1:
        raise PlanError(f"{where} must be an object with exactly one key.", "steps")
    (kind, value), allowed = next(iter(raw.items())), STEP_KINDS[strategy]
    if kind not in allowed:
        raise PlanError(
            f"{where}: a {strategy} plan takes {', '.join(sorted(allowed))}, not {kind!r}.", "steps"
        )
    if kind == "pause":
        return {"pause": _pause(value, where)}
    percent = _whole(value, f"{where} {kind}", 1, 100)
    if kind == "set_weight" and percent <= last_weight:
        raise PlanError(f"{where}: weights must grow (from {last_weight} to more, not {percent}).", "steps")
    return {kind: percent}


def _pause(value: Any, where: str) -> dict[str, int]:
    if not isinstance(value, dict) or set(value) - PAUSE_FIELDS:
        raise PlanError(
            f"{where}: pause takes an object with seconds, min_requests and/or warmup_seconds.", "steps"
        )
    pause = {}
    if "seconds" in value:
        pause["seconds"] = _whole(value["seconds"], f"{where} seconds", 0, MAX_PAUSE_SECONDS)
    if "min_requests" in value:
        pause["min_requests"] = _whole(value["min_requests"], f"{where} min_requests", 0, MAX_MIN_REQUESTS)
    if "warmup_seconds" in value:
        pause["warmup_seconds"] = _whole(
            value["warmup_seconds"], f"{where} warmup_seconds", 0, MAX_PAUSE_SECONDS
        )
        if not pause.get("seconds") and not pause.get("min_requests"):
            raise PlanError(
                f"{where}: warmup_seconds applies to a judged pause (seconds or min_requests).", "steps"
            )
        if pause.get("seconds") is not None and pause["warmup_seconds"] >= pause["seconds"]:
            raise PlanError(
                f"{where}: warmup_seconds must be less than seconds (the window is what is left after it).",
                "steps",
            )
    return pause


def parse_steps(raw: Any, strategy: str) -> list[dict[str, Any]]:
    """The checked plan (the strategy's default when ``raw`` is None)."""
    if strategy not in STEP_KINDS:
        raise PlanError(f"Unknown strategy {strategy!r}; use one of {', '.join(STEP_KINDS)}.", "strategy")
    if raw is None:
        return [dict(step) for step in DEFAULT_STEPS[strategy]]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_STEPS:
        raise PlanError(f"steps must be a list of 1 to {MAX_STEPS} steps.", "steps")
    steps, weight = [], 0
    for index, item in enumerate(raw):
        step = _step(item, index, strategy, weight)
        weight = step.get("set_weight", weight)
        steps.append(step)
    return steps


def pause_of(step: dict[str, Any]) -> Pause | None:
    if "pause" not in step:
        return None
    fields = step["pause"]
    return Pause(fields.get("seconds"), fields.get("min_requests", 0), fields.get("warmup_seconds", 0))


def parse_waves(raw: Any, regions: Sequence[str]) -> list[list[str]]:
    """Ordered groups covering every region of the deployment once; default: the first region, then the
    rest (``regions`` in the order the deployment lists them)."""
    if raw is None:
        return [list(regions[:1]), list(regions[1:])] if len(regions) > 1 else [list(regions)]
    if not isinstance(raw, list) or not raw or not all(isinstance(w, list) and w for w in raw):
        raise PlanError("waves must be a list of non-empty lists of region codes.", "waves")
    codes = [code for wave in raw for code in wave]
    if not all(isinstance(code, str) for code in codes):
        raise PlanError("waves must hold region codes (strings).", "waves")
    unknown = sorted(set(codes) - set(regions))
    if unknown:
        raise PlanError(f"The deployment does not run in {', '.join(unknown)}.", "waves")
    if len(codes) != len(set(codes)) or set(codes) != set(regions):
        missing = sorted(set(regions) - set(codes))
        why = f"missing {', '.join(missing)}" if missing else "a region is listed twice"
        raise PlanError(f"waves must list every region of the deployment exactly once ({why}).", "waves")
    return [list(wave) for wave in raw]
