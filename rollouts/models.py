"""Rollouts: a candidate version taking over a deployment region wave by region wave, step by step,
judged by analysis runs; and the timeline of each."""

from django.db import models
from django.utils import timezone

from core.models import Tenant
from regions.models import Deployment
from registry.models import ModelVersion
from rollouts.choices import ACTIVE_STATES, OnFailure, RolloutState, Strategy, Verdict


class Rollout(models.Model):
    """One candidate version replacing a deployment's version.

    ``steps`` is the plan each wave runs (``rollouts.plan``); ``waves`` the ordered region groups;
    ``wave`` and ``step`` where the controller is (the step not yet done). The state machine is in
    ``rollouts.choices``; every move is a compare-and-set, so a controller killed midway resumes where
    the database says it was.
    """

    owner = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="rollouts")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="rollouts")
    candidate = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="rollouts")
    baseline = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    strategy = models.CharField(max_length=16, choices=Strategy.choices)
    steps = models.JSONField()
    analysis = models.JSONField(default=dict, blank=True)
    waves = models.JSONField()
    alias = models.SlugField(max_length=64, blank=True)  # a custom alias moved to the candidate on success
    on_failure = models.CharField(max_length=16, choices=OnFailure.choices, default=OnFailure.STAGED)
    rollback_window_seconds = models.PositiveIntegerField(default=300)
    progress_deadline_seconds = models.PositiveIntegerField(default=900)
    promotes_version = models.BooleanField(default=True)  # the starter may move the version's lifecycle
    moved_to_canary = models.BooleanField(default=False)  # this rollout took the version staged → canary
    state = models.CharField(max_length=16, choices=RolloutState.choices, default=RolloutState.PENDING)
    wave = models.PositiveSmallIntegerField(default=0)
    step = models.PositiveSmallIntegerField(default=0)
    step_started_at = models.DateTimeField(null=True, blank=True)
    wave_started_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # why it paused, was aborted or failed
    webhook = models.URLField(
        blank=True
    )  # told when the rollout ends (best effort; the audit log is the record)
    created_by_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(state__in=sorted(ACTIVE_STATES)),
                name="one_active_rollout_per_deployment",
            )
        ]

    def __str__(self) -> str:
        return f"rollout {self.pk} of {self.deployment}"


class AnalysisRun(models.Model):
    """One judgement of one step in one region: candidate against baseline over the same window.

    ``measurements`` holds, per metric, the query, both sides' values and sample counts, the test, its
    statistic and p-value, the threshold and the metric's verdict (``rollouts.analysis.Measurement``).
    """

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="analysis_runs")
    wave = models.PositiveSmallIntegerField()
    step = models.PositiveSmallIntegerField()
    region = models.CharField(max_length=41)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    measurements = models.JSONField(default=list)
    message = models.TextField(blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "wave", "step", "region"], name="one_run_per_step")
        ]

    def __str__(self) -> str:
        return f"{self.rollout} w{self.wave}s{self.step} {self.region}: {self.verdict}"


class RolloutEvent(models.Model):
    """The rollout's timeline: steps taken, weights set, pauses, verdicts, rollback, promotion."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32)
    message = models.TextField()
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"{self.rollout} {self.kind}: {self.message[:60]}"
