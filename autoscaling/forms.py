"""The console's policy form. It only shapes input (text into numbers, the overrides' JSON into a value);
what a policy may hold is decided by ``autoscaling.policy`` through ``policy_set``, as for the API."""

import json
from typing import Any

from django import forms
from rest_framework.exceptions import ParseError

from autoscaling.choices import ScalerMode
from autoscaling.models import AutoscalingPolicy
from autoscaling.policy import FIELDS, METRICS, Policy
from core.api.parsers import MAX_JSON_DEPTH, nul_location
from core.errors import ApplicationError

DEFAULTS = Policy()
FLOATS = {*METRICS, "tolerance"}
MAX_OVERRIDES_CHARS = 20_000  # a dozen regions with every field overridden is under 8,000
# (legend, fields): how the form is laid out; every policy field appears once.
GROUPS = [
    ("Who scales", ["mode", "enabled"]),
    ("Replicas", ["min_replicas", "max_replicas"]),
    ("Targets per replica (at least one; the largest recommendation wins)", list(METRICS)),
    (
        "Behaviour",
        [
            "tolerance",
            "window_seconds",
            "scale_up_stabilization_seconds",
            "scale_down_stabilization_seconds",
            "scale_up_percent",
            "scale_up_replicas",
            "scale_up_period_seconds",
            "scale_down_replicas",
            "scale_down_period_seconds",
        ],
    ),
    ("Scale to zero", ["idle_seconds"]),
    ("Per-region overrides", ["overrides"]),
]
TARGETS_GROUP = 2
LABELS = {
    "min_replicas": ("Min replicas", "0 lets an idle region scale to zero; a request wakes it."),
    "max_replicas": ("Max replicas", "Per region; all of it must fit the tenant's GPU quota."),
    "waiting": ("Waiting requests", "vllm:num_requests_waiting per replica."),
    "running": ("Running requests", "vllm:num_requests_running per replica."),
    "kv_cache": ("KV-cache usage", "vllm:kv_cache_usage_perc, a fraction from 0 to 1."),
    "ttft_p95_seconds": ("TTFT p95 (seconds)", "An SLO on time to first token, p95 over the window."),
    "tolerance": ("Tolerance", "No change while value / target is within this of 1."),
    "window_seconds": ("Signal window (s)", "Signals are averaged over this window."),
    "scale_up_stabilization_seconds": ("Scale-up stabilization (s)", "The lowest recommendation in it wins."),
    "scale_down_stabilization_seconds": (
        "Scale-down stabilization (s)",
        "The highest recommendation in it wins, so a dip does not shrink the region.",
    ),
    "scale_up_percent": ("Scale up at most (%)", "Per scale-up period; the larger of this and the next."),
    "scale_up_replicas": ("Scale up at most (replicas)", "Per scale-up period."),
    "scale_up_period_seconds": ("Scale-up period (s)", ""),
    "scale_down_replicas": ("Scale down at most (replicas)", "Per scale-down period."),
    "scale_down_period_seconds": ("Scale-down period (s)", ""),
    "idle_seconds": ("Idle window (s)", "With min replicas 0: no request for this long scales to zero."),
}


def _number_field(name: str) -> forms.Field:
    label, help_text = LABELS[name]
    default = getattr(DEFAULTS, name)
    hint = f"Default {default:g}. " if default is not None else "Empty: not targeted. "
    kind = forms.FloatField if name in FLOATS else forms.IntegerField
    field = kind(required=False, label=label, help_text=hint + help_text)
    field.widget.attrs.update({"step": "any" if name in FLOATS else "1", "class": "num-input"})
    return field


class PolicyForm(forms.Form):
    mode = forms.ChoiceField(choices=ScalerMode.choices, initial=ScalerMode.CONTROL_PLANE)
    enabled = forms.BooleanField(
        required=False, initial=True, help_text="Off: the policy is kept and nothing acts on it."
    )
    overrides = forms.CharField(
        required=False,
        max_length=MAX_OVERRIDES_CHARS,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "spellcheck": "false", "class": "mono"}),
        help_text='Optional: {"region code": {"field": value}}, e.g. {"eu-west-1": {"max_replicas": 8}}.',
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in FIELDS:
            self.fields[name] = _number_field(name)
        self.group_errors: dict[int, str] = {}  # a refusal about a group of fields, by GROUPS index

    def clean_overrides(self) -> Any:
        text = self.cleaned_data.get("overrides", "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
            where = nul_location(value)  # "\u0000" decodes to what PostgreSQL cannot store
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from exc
        except (RecursionError, ParseError) as exc:
            raise forms.ValidationError(f"Nested deeper than {MAX_JSON_DEPTH} levels.") from exc
        if where is not None:
            raise forms.ValidationError(f"NUL characters (\\u0000) are not allowed, and {where} holds one.")
        return value

    def body(self) -> dict[str, Any]:
        """The request body ``policy_set`` takes; fields left empty take the policy's defaults."""
        data = self.cleaned_data
        numbers = {name: data[name] for name in FIELDS if data.get(name) is not None}
        return {"mode": data["mode"], "enabled": data["enabled"], "overrides": data["overrides"], **numbers}

    def refuse(self, exc: ApplicationError) -> None:
        """Put the service's refusal next to the field its detail names. A region's override names the
        field inside it (``overrides.<code>.max_replicas``): that is the overrides box here."""
        detail = exc.detail if isinstance(exc.detail, dict) else {}
        field = str(detail.get("field", ""))
        if field.startswith("overrides") or exc.message.startswith("overrides"):
            field = "overrides"
        if field == "metrics":  # no target at all: the targets' group, not one of them
            self.group_errors[TARGETS_GROUP] = exc.message
            return
        self.add_error(field if field in self.fields else None, exc.message)

    @property
    def refused(self) -> bool:
        return bool(self.errors or self.group_errors)

    def groups(self) -> list[tuple[str, list[forms.BoundField], str]]:
        """(legend, bound fields, the group's own error) in the order the page shows them."""
        return [
            (legend, [self[name] for name in names], self.group_errors.get(index, ""))
            for index, (legend, names) in enumerate(GROUPS)
        ]


def initial_of(policy: AutoscalingPolicy | None) -> dict[str, Any]:
    """The form's starting values: the saved policy, or the defaults for a new one."""
    if policy is None:
        return {name: value for name, value in DEFAULTS.as_dict().items() if value is not None}
    overrides = json.dumps(policy.overrides) if policy.overrides else ""
    return {**policy.spec, "mode": policy.mode, "enabled": policy.enabled, "overrides": overrides}
