"""Rollouts in the console: the list, a rollout's page (steps per wave, weights per region, analysis runs
with their numbers and charts, the timeline, the actions a caller may take) and the form that starts one.
Every read goes through ``rollouts.selectors``, every write through ``rollouts.services.rollouts``."""

import json
import re
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core.choices import Scope
from core.errors import ApplicationError, Forbidden, NotFound
from core.principal import Principal
from core.views import page
from regions import selectors as regions_selectors
from regions.models import Deployment
from registry import selectors as registry_selectors
from registry.choices import SERVABLE_STATES
from rollouts import forms, plan, selectors
from rollouts.choices import ACTIVE_STATES, RolloutState, Strategy
from rollouts.models import Rollout
from rollouts.services import rollouts

R = RolloutState
# Which state each action starts from (the machine refuses the rest; the buttons follow it).
ACTION_STATES: dict[str, frozenset[str]] = {
    "pause": frozenset({R.PROGRESSING}),
    "resume": frozenset({R.PAUSED}),
    "abort": ACTIVE_STATES,
    "promote": frozenset({R.PROGRESSING, R.PAUSED}),
}
VERDICT_COLORS = {"successful": "#15803d", "failed": "#b91c1c", "inconclusive": "#b45309"}
BASELINE_COLOR = "#94a3b8"
DEPLOYMENT_REF = re.compile(r"[-a-zA-Z0-9_]{1,50}/[-a-zA-Z0-9_]{1,50}")  # two slugs, nothing else
CHART_BAR = 140  # pixels for the larger of the two values


# --- the list ---------------------------------------------------------------------------------------
def _listed(p: Principal, state: str) -> QuerySet[Rollout]:
    found = selectors.rollouts_for(p).annotate(
        finished=Case(
            When(state__in=ACTIVE_STATES, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
    )
    if state:
        found = found.filter(state=state)
    return found.order_by("finished", "-created_at", "-pk")


@page
def rollout_list(request: HttpRequest, p: Principal) -> HttpResponse:
    state = request.GET.get("state", "")
    state = state if state in R.values else ""
    pages = Paginator(_listed(p, state), 50)
    context = {
        "page_obj": pages.get_page(request.GET.get("page")),
        "state": state,
        "states": R.choices,
    }
    return render(request, "rollouts/rollout_list.html", context)


# --- one rollout ------------------------------------------------------------------------------------
def step_label(step: dict[str, Any]) -> str:
    if "set_weight" in step:
        return f"candidate takes {step['set_weight']} %"
    if "set_mirror" in step:
        return f"mirror {step['set_mirror']} % of requests to the candidate"
    pause = plan.pause_of(step)
    if pause is None:
        return json.dumps(step)
    if not pause.judged:
        return "pause until someone resumes"
    wait = [f"{pause.seconds} s" if pause.seconds is not None else "", ""]
    if pause.min_requests:
        wait[1] = f"{pause.min_requests} requests on each side"
    warmup = f" (the first {pause.warmup_seconds} s left out)" if pause.warmup_seconds else ""
    return f"pause {' and '.join(w for w in wait if w)}, then analysis{warmup}"


def _finish_label(rollout: Rollout, last: bool) -> str:
    if last:
        return "promote: the candidate becomes the stable version everywhere"
    if rollout.strategy == Strategy.SHADOW:
        return "next wave (mirroring goes on here)"
    return "candidate takes 100 % here; next wave"


def _step_state(rollout: Rollout, wave: int, step: int) -> str:
    """done, current, paused, stopped (where an aborted or failed rollout ended) or next."""
    if rollout.state == R.SUCCEEDED:
        return "done"
    where, here = (rollout.wave, rollout.step), (wave, step)
    if here < where:
        return "done"
    if here > where or rollout.state == R.PENDING:
        return "next"
    if rollout.state in (R.ABORTED, R.FAILED):
        return "stopped"
    return "paused" if rollout.state == R.PAUSED else "current"


def timeline(rollout: Rollout) -> list[dict[str, Any]]:
    """Each wave's regions and its steps (plus the implicit end of the wave), with where the rollout is."""
    runs: dict[tuple[int, int], list[Any]] = {}
    for run in rollout.analysis_runs.all():
        runs.setdefault((run.wave, run.step), []).append(run)
    waves = []
    for index, regions in enumerate(rollout.waves):
        last = index == len(rollout.waves) - 1
        labels = [step_label(s) for s in rollout.steps] + [_finish_label(rollout, last)]
        steps = [
            {
                "number": number + 1,
                "label": label,
                "state": _step_state(rollout, index, number),
                "runs": runs.get((index, number), []),
            }
            for number, label in enumerate(labels)
        ]
        states = {s["state"] for s in steps}
        state = "done" if states == {"done"} else "next" if states == {"next"} else "current"
        waves.append({"number": index + 1, "regions": regions, "steps": steps, "state": state})
    return waves


def number(value: Any, digits: int = 4) -> str:
    """A measured value for people: 12,346 · 812.5 · 0.0421 · 1.2e-07; a dash for none."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def chart(m: dict[str, Any]) -> dict[str, Any] | None:
    """Two bars, candidate against baseline, scaled to the larger; None when a side has no value."""
    candidate, baseline = m.get("candidate"), m.get("baseline")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (candidate, baseline)):
        return None
    c, b = abs(float(candidate)), abs(float(baseline))  # type: ignore[arg-type]
    peak = max(c, b) or 1.0
    widths = {"candidate": round(c / peak * CHART_BAR, 1), "baseline": round(b / peak * CHART_BAR, 1)}
    return {
        **widths,
        "candidate_x": widths["candidate"] + 40,
        "baseline_x": widths["baseline"] + 40,
        "color": VERDICT_COLORS.get(str(m.get("verdict")), "#3b82f6"),
        "base_color": BASELINE_COLOR,
        "label": f"{m.get('metric', '')}: candidate {number(candidate)}, baseline {number(baseline)}",
    }


def measurement_row(m: Any) -> dict[str, Any]:
    m = m if isinstance(m, dict) else {"metric": str(m)}
    return {
        "metric": m.get("metric", ""),
        "stat": m.get("stat", ""),
        "source": m.get("source", ""),
        "query": m.get("query", ""),
        "candidate": number(m.get("candidate")),
        "baseline": number(m.get("baseline")),
        "candidate_samples": m.get("candidate_samples", "—"),
        "baseline_samples": m.get("baseline_samples", "—"),
        "test": m.get("test") or "—",
        "statistic": number(m.get("statistic")),
        "p_value": number(m.get("p_value"), 3),
        "threshold": m.get("threshold") or "—",
        "verdict": m.get("verdict", ""),
        "reason": m.get("reason", ""),
        "chart": chart(m),
    }


def analysis_runs(rollout: Rollout) -> list[dict[str, Any]]:
    return [
        {"run": run, "measurements": [measurement_row(m) for m in run.measurements or []]}
        for run in rollout.analysis_runs.all()
    ]


def actions_for(p: Principal, rollout: Rollout) -> list[str]:
    """The buttons this caller gets: none without deployments:write on the rollout's tenant."""
    if not p.may(Scope.DEPLOYMENTS_WRITE, rollout.owner_id):
        return []
    return [name for name, states in ACTION_STATES.items() if rollout.state in states]


@page
def rollout_detail(request: HttpRequest, p: Principal, pk: int) -> HttpResponse:
    rollout = selectors.rollout_get(p, pk)
    context = {
        "rollout": rollout,
        "active": rollout.state in ACTIVE_STATES,
        "waves": timeline(rollout),
        "weights": selectors.weights(rollout),
        "runs": analysis_runs(rollout),
        "events": rollout.events.all(),
        "actions": actions_for(p, rollout),
        "watch": request.GET.get("watch") == "1" and rollout.state in ACTIVE_STATES,
    }
    return render(request, "rollouts/rollout_detail.html", context)


@require_POST
@page
def rollout_action(request: HttpRequest, p: Principal, pk: int, action: str) -> HttpResponse:
    """pause, resume, abort, promote: one service each. A refusal of the machine or of the input is a
    message on the rollout's page; one of permission is the 403 page (``page``)."""
    rollout = selectors.rollout_get(p, pk)
    form = forms.ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The reason is not valid: {' '.join(str(e) for e in form.errors['reason'])}")
        return redirect("rollouts:detail", pk=pk)
    reason = form.cleaned_data["reason"]
    try:
        if action == "pause":
            rollouts.rollout_pause(actor=p, rollout=rollout, reason=reason)
        elif action == "resume":
            rollouts.rollout_resume(actor=p, rollout=rollout)
        elif action == "abort":
            rollouts.rollout_abort(actor=p, rollout=rollout, reason=reason)
        else:
            rollouts.rollout_promote(actor=p, rollout=rollout, reason=reason)
    except (Forbidden, NotFound):
        raise
    except ApplicationError as exc:
        messages.error(request, f"Could not {action} {rollout}: {exc.message}")
    else:
        messages.success(request, f"Rollout {rollout.pk} of {rollout.deployment} is {rollout.state}.")
    return redirect("rollouts:detail", pk=pk)


# --- starting one -----------------------------------------------------------------------------------
def _deployment(p: Principal, ref: str) -> Deployment:
    if not DEPLOYMENT_REF.fullmatch(ref):
        raise NotFound("Name the deployment as owner/name, e.g. /rollouts/new/?deployment=acme/chat.")
    owner, _, name = ref.partition("/")
    deployment = regions_selectors.deployment_get(p, owner, name)
    p.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
    return deployment


def _versions(deployment: Deployment) -> list[tuple[str, str]]:
    found = registry_selectors.versions_of(deployment.model).filter(status__in=SERVABLE_STATES)
    return [(v.version, f"{v.version} ({v.status})") for v in found.exclude(pk=deployment.version_id)]


def _start(p: Principal, form: forms.RolloutStartForm, deployment: Deployment) -> Rollout | None:
    """The started rollout, or None with the refusal on the form (nothing written)."""
    data = form.cleaned_data
    try:
        return rollouts.rollout_start(
            actor=p,
            deployment=deployment,
            version=data["version"],
            strategy=data["strategy"],
            steps=data["steps"],
            analysis=data["analysis"],
            waves=data["waves"],
            on_failure=data["on_failure"],
        )
    except ApplicationError as exc:
        detail = exc.detail if isinstance(exc.detail, dict) else {}
        field = next((name for name in detail if name in form.fields), None)
        form.add_error(field, exc.message)
        return None


@page
def rollout_new(request: HttpRequest, p: Principal) -> HttpResponse:
    deployment = _deployment(p, request.GET.get("deployment", ""))
    strategy = request.GET.get("strategy", "")
    strategy = strategy if strategy in Strategy.values else Strategy.CANARY
    initial = {"strategy": strategy, "steps": json.dumps(plan.DEFAULT_STEPS[strategy])}
    posted = request.POST if request.method == "POST" else None
    form = forms.RolloutStartForm(posted, versions=_versions(deployment), initial=initial)
    started = _start(p, form, deployment) if posted is not None and form.is_valid() else None
    if started is not None:
        messages.success(
            request,
            f"Rollout {started.pk} of {deployment} started: {started.strategy} of "
            f"{started.candidate.version} over {started.baseline.version}.",
        )
        return redirect("rollouts:detail", pk=started.pk)
    context = {
        "form": form,
        "deployment": deployment,
        "defaults": {s.value: (s.label, json.dumps(plan.DEFAULT_STEPS[s])) for s in Strategy},
    }
    status = 400 if form.errors else 200
    return render(request, "rollouts/rollout_form.html", context, status=status)
