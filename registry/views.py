"""Registry pages of the console: catalog, model, version (timeline, validation, sizing) and diff."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core import selectors as core_selectors
from core.choices import Scope
from core.errors import ApplicationError
from core.principal import Principal
from core.views import page
from registry import forms, selectors
from registry.diff import lineage, version_diff
from registry.engine_args import render_flags
from registry.models import RegisteredModel
from registry.services import lifecycle, models
from registry.services.access import require_gate_override
from registry.sizing import sizing_of


def _owners(p: Principal) -> list[tuple[str, str]]:
    """Where this principal may register models: the platform and/or its tenants."""
    owners = [("platform", "Platform (shared catalog)")] if p.may(Scope.REGISTRY_WRITE) else []
    tenants = core_selectors.tenants_for(p, Scope.REGISTRY_WRITE)
    return owners + [(t.slug, f"{t.slug} ({t.name})") for t in tenants]


@page
def catalog(request: HttpRequest, p: Principal) -> HttpResponse:
    p.require_any(Scope.REGISTRY_READ)
    found = selectors.models_for(p).prefetch_related("versions", "aliases__version")
    query = request.GET.get("q", "").strip()
    if query:
        found = found.filter(name__icontains=query)
    for field in ("task", "visibility"):
        if request.GET.get(field):
            found = found.filter(**{field: request.GET[field]})
    owners = _owners(p)
    form = forms.ModelForm(request.POST or None, owners=owners)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        slug = data.pop("owner")
        owner = None if slug == "platform" else core_selectors.tenant_get(p, slug)
        try:
            model = models.model_register(actor=p, owner=owner, **data)
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Model {model.ref} registered.")
            return redirect("registry:model", owner=model.owner_slug, name=model.name)
    context = {"models": found, "form": form, "can_create": bool(owners), "query": query}
    return render(request, "registry/catalog.html", context, status=400 if form.errors else 200)


@page
def model_detail(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    model = selectors.model_get(p, owner, name)
    aliases = model.aliases.select_related("version").prefetch_related("moves__version")
    context = {
        "model": model,
        "versions": selectors.versions_of(model),
        "aliases": aliases,
        "can_rollback": _may_override(p, model) and selectors.production_version(model) is not None,
    }
    return render(request, "registry/model.html", context)


def _may_override(p: Principal, model: RegisteredModel) -> bool:
    try:
        require_gate_override(p, model)
    except ApplicationError:
        return False
    return True


@page
def version_detail(request: HttpRequest, p: Principal, owner: str, name: str, version: str) -> HttpResponse:
    model = selectors.model_get(p, owner, name)
    found = selectors.version_get(model, version)
    report = selectors.latest_report(found)
    context = {
        "model": model,
        "version": found,
        "transitions": found.transitions.all(),
        "next_states": lifecycle.transition_choices(found),
        "can_promote": p.may(Scope.REGISTRY_PROMOTE, model.owner_id),
        "report": report,
        "older_reports": found.reports.exclude(pk=report.pk) if report else [],
        "sizing": sizing_of(found),
        "flags": " ".join(render_flags(found.engine_args)),
        "lineage": lineage(found),
        "others": selectors.versions_of(model).exclude(pk=found.pk),
    }
    return render(request, "registry/version.html", context)


@require_POST
@page
def version_transition(
    request: HttpRequest, p: Principal, owner: str, name: str, version: str
) -> HttpResponse:
    model = selectors.model_get(p, owner, name)
    found = selectors.version_get(model, version)
    form = forms.TransitionForm(request.POST)
    if form.is_valid():
        lifecycle.version_transition(actor=p, version=found, **form.cleaned_data)
        messages.success(request, f"{found} is now {found.status}.")
    return redirect("registry:version", owner=owner, name=name, version=version)


@require_POST
@page
def model_rollback(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    model = selectors.model_get(p, owner, name)
    form = forms.RollbackForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A rollback needs a reason.")
    else:
        target = lifecycle.model_rollback(actor=p, model=model, reason=form.cleaned_data["reason"])
        messages.success(request, f"Rolled back: {target} is production again.")
    return redirect("registry:model", owner=owner, name=name)


@page
def version_compare(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    model = selectors.model_get(p, owner, name)
    a = selectors.version_get(model, request.GET.get("from", ""))
    b = selectors.version_get(model, request.GET.get("to", ""))
    return render(request, "registry/diff.html", {"model": model, "diff": version_diff(a, b)})
