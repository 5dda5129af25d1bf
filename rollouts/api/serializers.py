"""Input and output shapes of the rollouts API."""

from typing import Any

from django.core.validators import URLValidator
from rest_framework import serializers

from core.api.conventions import StrictSerializer
from rollouts import selectors
from rollouts.choices import OnFailure, Strategy
from rollouts.models import AnalysisRun, Rollout, RolloutEvent

REF = r"^[a-z0-9][a-z0-9-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"


class RolloutWriteSerializer(StrictSerializer):
    """``deployment`` ("tenant/name"), or ``model`` ("owner/name") with ``follow_alias`` for every
    deployment that follows that alias; steps, analysis and waves are checked by the service."""

    deployment = serializers.RegexField(REF, max_length=120, required=False)
    model = serializers.RegexField(REF, max_length=120, required=False)
    follow_alias = serializers.SlugField(max_length=64, required=False)
    version = serializers.CharField(max_length=64)
    strategy = serializers.ChoiceField(choices=Strategy.choices, default=Strategy.CANARY)
    steps = serializers.JSONField(required=False, default=None)
    analysis = serializers.JSONField(required=False, default=None)
    waves = serializers.JSONField(required=False, default=None)
    alias = serializers.SlugField(max_length=64, required=False)
    on_failure = serializers.ChoiceField(choices=OnFailure.choices, default=OnFailure.STAGED)
    rollback_window_seconds = serializers.IntegerField(min_value=0, max_value=7 * 24 * 3600, default=300)
    progress_deadline_seconds = serializers.IntegerField(min_value=1, max_value=24 * 3600, default=900)
    webhook = serializers.URLField(
        max_length=500, required=False, validators=[URLValidator(schemes=["http", "https"])]
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        by_deployment = "deployment" in attrs
        by_alias = "model" in attrs or "follow_alias" in attrs
        if by_deployment == by_alias or (by_alias and not ("model" in attrs and "follow_alias" in attrs)):
            raise serializers.ValidationError(
                "Give either deployment, or model and follow_alias (every deployment following it)."
            )
        return attrs


class ReasonSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000, required=False, default="", allow_blank=True)


class AnalysisRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = AnalysisRun
        fields = [
            "wave",
            "step",
            "region",
            "window_start",
            "window_end",
            "verdict",
            "measurements",
            "message",
            "at",
        ]


class RolloutEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RolloutEvent
        fields = ["kind", "message", "at"]


class RolloutSerializer(serializers.ModelSerializer):
    owner = serializers.SerializerMethodField()
    deployment = serializers.SerializerMethodField()
    candidate = serializers.SerializerMethodField()
    baseline = serializers.SerializerMethodField()
    weights = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = [
            "id",
            "owner",
            "deployment",
            "candidate",
            "baseline",
            "strategy",
            "steps",
            "analysis",
            "waves",
            "alias",
            "on_failure",
            "rollback_window_seconds",
            "progress_deadline_seconds",
            "state",
            "wave",
            "step",
            "reason",
            "weights",
            "created_by_name",
            "created_at",
            "updated_at",
            "finished_at",
        ]

    def get_owner(self, rollout: Rollout) -> str:
        return rollout.owner.slug

    def get_deployment(self, rollout: Rollout) -> str:
        return f"{rollout.owner.slug}/{rollout.deployment.name}"

    def get_candidate(self, rollout: Rollout) -> str:
        return rollout.candidate.version

    def get_baseline(self, rollout: Rollout) -> str:
        return rollout.baseline.version

    def get_weights(self, rollout: Rollout) -> list[dict[str, Any]]:
        return selectors.weights(rollout)


class RolloutDetailSerializer(RolloutSerializer):
    analysis_runs = AnalysisRunSerializer(many=True, read_only=True)
    events = RolloutEventSerializer(many=True, read_only=True)

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "analysis_runs", "events"]
