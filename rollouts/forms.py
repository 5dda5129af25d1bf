"""Console forms of rollouts. They only shape input (JSON text into values); the service decides what a
plan may hold (``rollouts.plan``, ``rollouts.analysis``)."""

import json
from typing import Any

from django import forms
from rest_framework.exceptions import ParseError

from core.api.parsers import MAX_JSON_DEPTH, nul_location
from rollouts.choices import OnFailure, Strategy

MAX_JSON_CHARS = 20_000  # a 50-step plan with pauses is under 3,000 characters


def _json(form: forms.Form, name: str) -> Any:
    """The field's JSON value, None when left empty; a readable error for text that is not JSON."""
    text = form.cleaned_data.get(name, "").strip()
    if not text:
        return None
    try:
        value = json.loads(text)
        where = nul_location(value)  # a "\u0000" escape decodes to what PostgreSQL cannot store
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        ) from exc
    except (RecursionError, ParseError) as exc:  # "[[[[…" thousands deep, or deeper than the API takes
        raise forms.ValidationError(f"Nested deeper than {MAX_JSON_DEPTH} levels.") from exc
    if where is not None:
        raise forms.ValidationError(f"NUL characters (\\u0000) are not allowed, and {where} holds one.")
    return value


class JsonField(forms.CharField):
    widget = forms.Textarea

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(max_length=MAX_JSON_CHARS, strip=True, **kwargs)
        self.widget.attrs.update({"rows": 6, "cols": 60, "spellcheck": "false", "class": "mono"})


class RolloutStartForm(forms.Form):
    version = forms.ChoiceField(label="Candidate version")
    strategy = forms.ChoiceField(choices=Strategy.choices, initial=Strategy.CANARY)
    steps = JsonField(
        help_text='Each wave runs these, e.g. [{"set_weight": 10}, {"pause": {"seconds": 60, '
        '"min_requests": 30}}, {"set_weight": 50}]. Empty: the strategy\'s default.'
    )
    analysis = JsonField(
        label="Analysis",
        help_text="Optional: the metrics, thresholds and tests that judge each timed or counted pause.",
    )
    waves = JsonField(
        label="Region waves",
        help_text='Optional: ordered groups of regions, e.g. [["eu-west-1"], ["eu-central-1"]]. '
        "Empty: the first region, then the rest.",
    )
    on_failure = forms.ChoiceField(
        choices=OnFailure.choices, initial=OnFailure.STAGED, label="On failure, the version goes"
    )

    def __init__(self, *args: Any, versions: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = versions  # type: ignore[attr-defined]

    def clean_steps(self) -> Any:
        return _json(self, "steps")

    def clean_analysis(self) -> Any:
        return _json(self, "analysis")

    def clean_waves(self) -> Any:
        return _json(self, "waves")


class ReasonForm(forms.Form):
    """Pause takes an optional reason; abort and promote require one (the service says so)."""

    reason = forms.CharField(max_length=2000, required=False, strip=True)
