"""What the autoscaler remembers between passes (``ScalerState``): read once per pass, written only where
it changed, in a few statements whatever the fleet's size.

The timeline samples (an hour of points per region) are the bulk of a state and change once a minute: on
PostgreSQL they are never read by the pass, a new point is appended (and the oldest dropped) by the UPDATE
itself, and the changed states go in one ``UPDATE … FROM unnest(…)`` per thousand. Django's
``bulk_update`` builds a CASE per row and field in Python: seconds for a fleet of thousands. Elsewhere
(SQLite) the samples are read and ``bulk_update`` writes them.
"""

import json
from datetime import datetime
from typing import Any

from django.db import connection

from autoscaling import algorithm
from autoscaling.models import ScalerState
from autoscaling.policy import Policy
from regions.models import DeploymentTarget

SAMPLE_SECONDS = 60  # the console's timeline: one point a minute
SAMPLES_KEPT = 60  # an hour
STAGGER_SECONDS = 15  # the beat's default interval: consecutive targets' minutes start a pass apart
FIELDS = ["recommendations", "changes", "samples", "signals", "limited", "evaluated_at"]
BATCH = 1000

# The new point appended to the stored ones, only the last SAMPLES_KEPT kept (a JSON path slice: lax, so
# a shorter array is kept whole); a state without a new point keeps its samples as they are.
UPDATE = f"""
    UPDATE autoscaling_scalerstate AS s
    SET recommendations = v.recommendations, changes = v.changes, signals = v.signals,
        limited = v.limited, evaluated_at = v.evaluated_at,
        samples = CASE WHEN v.sample IS NULL THEN s.samples ELSE jsonb_path_query_array(
            s.samples || jsonb_build_array(v.sample), '$[last - {SAMPLES_KEPT - 1} to last]') END
    FROM unnest(%s::bigint[], %s::jsonb[], %s::jsonb[], %s::jsonb[], %s::text[], %s::timestamptz[],
                %s::jsonb[])
        AS v(id, recommendations, changes, signals, limited, evaluated_at, sample)
    WHERE s.id = v.id
"""


def _appends_in_sql() -> bool:
    return connection.vendor == "postgresql"


def states_of(targets: list[DeploymentTarget]) -> dict[int, ScalerState]:
    """Every target's state (created when missing), by target id; without the samples where the UPDATE
    appends them."""
    found = ScalerState.objects.filter(target__in=targets)
    if _appends_in_sql():
        found = found.defer("samples")
    states = {s.target_id: s for s in found}
    missing = [ScalerState(target=t) for t in targets if t.pk not in states]
    for state in ScalerState.objects.bulk_create(missing):
        states[state.target_id] = state
    return states


def _minute(state: ScalerState, epoch: float) -> int:
    """The timeline minute ``epoch`` falls in for this state: each state's minutes start at its own second
    (from its target's id), so a fleet's points are spread over the passes of a minute instead of all
    being due in the same one."""
    return int((epoch + state.target_id * STAGGER_SECONDS) // SAMPLE_SECONDS)


class Memory:
    """The states a pass changed, and the timeline point due for each (written by ``write``)."""

    def __init__(self) -> None:
        self.dirty: list[ScalerState] = []
        self.samples: dict[int, list[Any]] = {}  # state id: the point to append

    def remember(
        self,
        state: ScalerState,
        target: DeploymentTarget,
        decision: algorithm.Decision,
        change: tuple[int, int] | None,
        limited: str,
        now: datetime,
        values: dict[str, float],
        policy: Policy,
    ) -> None:
        """Update the state from this pass; keep it for writing when anything in it changed."""
        epoch = now.timestamp()
        dirty = False
        if decision.recommendations != state.recommendations:
            state.recommendations, dirty = decision.recommendations, True
        keep = max(policy.scale_up_period_seconds, policy.scale_down_period_seconds)
        changes = [c for c in state.changes if c[0] > epoch - keep]
        if change is not None:
            changes.append([epoch, *change])
        if changes != state.changes:
            state.changes, dirty = changes, True
        if limited != state.limited:
            state.limited, dirty = limited, True
        # evaluated_at is the last point's time: it moves only when a point is taken.
        last = state.evaluated_at.timestamp() if state.evaluated_at else None
        if last is None or _minute(state, epoch) != _minute(state, last) or change is not None:
            replicas = change[1] if change is not None else target.desired_replicas
            self.samples[state.pk] = [epoch, replicas, values]
            state.signals, state.evaluated_at, dirty = values, now, True
        if dirty:
            self.dirty.append(state)

    def write(self) -> None:
        if not self.dirty:
            return
        if not _appends_in_sql():
            for state in self.dirty:
                if state.pk in self.samples:
                    state.samples = [*state.samples, self.samples[state.pk]][-SAMPLES_KEPT:]
            ScalerState.objects.bulk_update(self.dirty, FIELDS, batch_size=500)
            return
        with connection.cursor() as cursor:
            for start in range(0, len(self.dirty), BATCH):
                cursor.execute(UPDATE, self._columns(self.dirty[start : start + BATCH]))

    def _columns(self, batch: list[ScalerState]) -> list[list[Any]]:
        def as_json(value: Any) -> str:
            return json.dumps(value)

        return [
            [s.pk for s in batch],
            [as_json(s.recommendations) for s in batch],
            [as_json(s.changes) for s in batch],
            [as_json(s.signals) for s in batch],
            [s.limited for s in batch],
            [s.evaluated_at for s in batch],
            [as_json(self.samples[s.pk]) if s.pk in self.samples else None for s in batch],
        ]
