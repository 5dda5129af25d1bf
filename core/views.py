"""The operator console: pages over the same selectors and services the API uses."""

from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core import forms, selectors
from core.choices import AuditSource, Priority, Scope
from core.errors import ApplicationError, Forbidden, NotFound
from core.models import Invitation
from core.principal import Principal
from core.services import operations, secrets, tenants, tokens, users

View = Callable[..., HttpResponse]


def principal_of(request: HttpRequest) -> Principal:
    if isinstance(request.user, Principal):  # an API request rendering a template (the docs page)
        return request.user
    if not hasattr(request, "_principal"):
        request._principal = Principal.for_user(request.user, source=AuditSource.DASHBOARD)  # type: ignore[attr-defined,arg-type]
    return request._principal  # type: ignore[attr-defined,no-any-return]


def page(view: View) -> View:
    """Login required; domain errors become a 404/403 page or a message on the form's page."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, principal_of(request), *args, **kwargs)
        except (NotFound, Forbidden) as exc:
            return render(
                request, "error.html", {"status": exc.status, "message": exc.message}, status=exc.status
            )
        except ApplicationError as exc:
            messages.error(request, exc.message)
            back = request.META.get("HTTP_REFERER", "")
            safe = url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure())
            return redirect(back if safe else "dashboard:overview")

    return wrapper


def navigation(request: HttpRequest) -> dict[str, Any]:
    """Navigation entries the signed-in user may open (context processor)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    p = principal_of(request)
    scopes = p.all_scopes
    items = [
        ("Overview", "dashboard:overview", True),
        ("Registry", "registry:catalog", Scope.REGISTRY_READ in scopes),
        ("Regions", "regions:list", Scope.DEPLOYMENTS_READ in scopes),
        ("Deployments", "deployments:list", Scope.DEPLOYMENTS_READ in scopes),
        ("Rollouts", "rollouts:list", Scope.DEPLOYMENTS_READ in scopes),
        ("Routing", "routing:routing", Scope.DEPLOYMENTS_READ in scopes),
        ("Pipelines", "routing:pipelines", Scope.REGISTRY_READ in scopes),
        ("Costs", "billing:costs", Scope.BILLING_READ in scopes),
        ("Audit", "dashboard:audit", Scope.AUDIT_READ in scopes),
        ("Tenants", "dashboard:tenants", Scope.TENANTS_READ in scopes),
        ("Users", "dashboard:users", Scope.TENANTS_READ in scopes),
        ("Tokens", "dashboard:tokens", True),
        # Shown while an invitation waits for an answer (the page itself is always reachable).
        (
            "Invitations",
            "dashboard:invitations",
            selectors.invitations_to(p).filter(status="pending").exists(),
        ),
    ]
    return {"nav_items": [(label, name) for label, name, shown in items if shown], "principal": p}


@page
def tenant_list(request: HttpRequest, p: Principal) -> HttpResponse:
    context = {"tenants": selectors.tenants_for(p), "can_create": p.may(Scope.TENANTS_WRITE)}
    return render(request, "controlplane/tenant_list.html", context)


@page
def tenant_create(request: HttpRequest, p: Principal) -> HttpResponse:
    p.require(Scope.TENANTS_WRITE)
    form = forms.TenantForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = tenants.tenant_create(actor=p, **form.cleaned_data)
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Tenant {tenant.slug} created.")
            return redirect("dashboard:tenant", slug=tenant.slug)
    status = 400 if request.method == "POST" else 200
    return render(request, "controlplane/form.html", {"form": form, "title": "New tenant"}, status=status)


@page
def tenant_detail(request: HttpRequest, p: Principal, slug: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug)
    context = {
        "tenant": tenant,
        "members": selectors.memberships_for(p, tenant),
        "robots": selectors.service_accounts_for(p).filter(tenant=tenant),
        "can_edit": p.may(Scope.TENANTS_WRITE),
        "can_manage_members": p.may(Scope.MEMBERS_WRITE, tenant.pk),
        "member_form": forms.MemberForm(),
        "invitations": (
            selectors.invitations_of_tenant(p, tenant).filter(status="pending")
            if p.may(Scope.MEMBERS_WRITE, tenant.pk)
            else []
        ),
        "robot_form": forms.ServiceAccountForm(),
        "secrets": selectors.secrets_of(p, tenant),
        "can_write_secrets": p.may(Scope.SECRETS_WRITE, tenant.pk),
        "secret_form": forms.SecretForm(),
    }
    return render(request, "controlplane/tenant_detail.html", context)


@page
def tenant_edit(request: HttpRequest, p: Principal, slug: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug)
    p.require(Scope.TENANTS_WRITE)
    initial = {name: getattr(tenant, name) for name in tenants.EDITABLE_TENANT_FIELDS} | {
        "revision": tenant.revision
    }
    form = forms.TenantEditForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        changes = dict(form.cleaned_data)
        revision = changes.pop("revision")
        try:
            tenants.tenant_update(actor=p, tenant=tenant, changes=changes, expected_revision=revision)
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Tenant {tenant.slug} updated.")
            return redirect("dashboard:tenant", slug=tenant.slug)
    status = 400 if request.method == "POST" else 200
    context = {"form": form, "title": f"Edit {tenant.slug}"}
    return render(request, "controlplane/form.html", context, status=status)


@require_POST
@page
def member_set(request: HttpRequest, p: Principal, slug: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug)
    form = forms.MemberForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a username and a role.")
        return redirect("dashboard:tenant", slug=slug)
    user, role = selectors.user_by_username(form.cleaned_data["username"]), form.cleaned_data["role"]
    if isinstance(tenants.membership_add_or_invite(actor=p, tenant=tenant, user=user, role=role), Invitation):
        messages.success(request, f"{user.username} is invited as {role}; they join when they accept.")
    else:
        messages.success(request, f"{user.username} is now {role} of {tenant.slug}.")
    return redirect("dashboard:tenant", slug=slug)


@page
def invitation_list(request: HttpRequest, p: Principal) -> HttpResponse:
    """The invitations addressed to the signed-in user, to accept or decline."""
    context = {"invitations": selectors.invitations_to(p), "now": timezone.now()}
    return render(request, "controlplane/invitation_list.html", context)


@require_POST
@page
def invitation_answer(request: HttpRequest, p: Principal, pk: int, answer: str) -> HttpResponse:
    invitation = selectors.invitation_to_get(p, pk)
    if answer == "accept":
        tenants.invitation_accept(actor=p, invitation=invitation)
        messages.success(request, f"You joined {invitation.tenant.slug} as {invitation.role}.")
    else:
        tenants.invitation_decline(actor=p, invitation=invitation)
        messages.success(request, f"You declined the invitation to {invitation.tenant.slug}.")
    return redirect("dashboard:invitations")


@require_POST
@page
def invitation_withdraw(request: HttpRequest, p: Principal, slug: str, pk: int) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug)
    invitation = selectors.invitation_of_tenant_get(p, tenant, pk)
    tenants.invitation_withdraw(actor=p, invitation=invitation)
    messages.success(request, f"The invitation of {invitation.user.username} is withdrawn.")
    return redirect("dashboard:tenant", slug=slug)


@require_POST
@page
def member_remove(request: HttpRequest, p: Principal, slug: str, username: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug)
    membership = selectors.memberships_for(p, tenant).filter(user__username=username).first()
    if membership is None:
        raise NotFound(f"'{username}' is not a member of {slug}.")
    tenants.membership_remove(actor=p, membership=membership)
    messages.success(request, f"{username} removed from {slug}.")
    return redirect("dashboard:tenant", slug=slug)


@require_POST
@page
def robot_create(request: HttpRequest, p: Principal, slug: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug)
    form = forms.ServiceAccountForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A service account needs a slug-like name and a role.")
        return redirect("dashboard:tenant", slug=slug)
    robot = tenants.service_account_create(actor=p, tenant=tenant, **form.cleaned_data)
    messages.success(request, f"Service account {robot} created.")
    return redirect("dashboard:tenant", slug=slug)


@require_POST
@page
def secret_put(request: HttpRequest, p: Principal, slug: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug, None)
    form = forms.SecretForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A secret needs a name (lowercase letters, digits, -) and a value.")
        return redirect("dashboard:tenant", slug=slug)
    secret, created = secrets.secret_put(actor=p, owner=tenant, **form.cleaned_data)
    messages.success(
        request, f"Secret {secret} {'stored' if created else 'replaced'} (revision {secret.revision})."
    )
    return redirect("dashboard:tenant", slug=slug)


@require_POST
@page
def secret_delete(request: HttpRequest, p: Principal, slug: str, name: str) -> HttpResponse:
    tenant = selectors.tenant_get(p, slug, None)
    secret = selectors.secret_get(p, tenant, name)
    secrets.secret_delete(actor=p, secret=secret)
    messages.success(request, f"Secret {secret} deleted.")
    return redirect("dashboard:tenant", slug=slug)


@page
def user_list(request: HttpRequest, p: Principal) -> HttpResponse:
    p.require_any(Scope.TENANTS_READ)
    form = forms.UserForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = users.user_create(actor=p, **form.cleaned_data)
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"User {user.username} created.")
            return redirect("dashboard:users")
    # Only memberships of tenants the caller may see: a badge naming another tenant would reveal it.
    visible = Prefetch("memberships", queryset=selectors.memberships_for(p))
    people = selectors.users_for(p).prefetch_related(visible)
    context = {"people": people, "form": form, "can_create": p.may(Scope.USERS_WRITE)}
    return render(request, "controlplane/user_list.html", context, status=400 if form.errors else 200)


def _token_owners(p: Principal) -> list[tuple[str, str]]:
    owners = [("me", f"Me ({p.name})")] if p.user is not None else []
    for robot in selectors.service_accounts_for(p).filter(is_active=True):
        if p.may(*tokens.robot_tokens_permission(robot)):
            owners.append((str(robot.pk), f"Service account {robot}"))
    return owners


def _token_tenants(p: Principal) -> list[tuple[str, str]]:
    return [(t.slug, t.slug) for t in selectors.tenants_joined(p)]


@page
def token_list(request: HttpRequest, p: Principal) -> HttpResponse:
    form = forms.TokenForm(request.POST or None, owners=_token_owners(p), tenants=_token_tenants(p))
    created = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        robot = None
        if data["owner"] != "me":
            robot = selectors.service_accounts_for(p).get(pk=int(data["owner"]))
        days = data.get("expires_in_days")
        try:
            created = tokens.token_create(
                actor=p,
                name=data["name"],
                scopes=data["scopes"],
                service_account=robot,
                tenant=selectors.tenant_get(p, data["tenant"], None) if data.get("tenant") else None,
                expires_at=timezone.now() + timedelta(days=days) if days else None,
                priority=data.get("priority") or Priority.INTERACTIVE,
            )
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            form = forms.TokenForm(owners=_token_owners(p), tenants=_token_tenants(p))
    context = {
        "tokens": selectors.tokens_for(p),
        "form": form,
        "created": created,
        "now": timezone.now(),
    }
    return render(request, "controlplane/token_list.html", context, status=400 if form.errors else 200)


@require_POST
@page
def token_revoke(request: HttpRequest, p: Principal, pk: int) -> HttpResponse:
    token = tokens.token_revoke(actor=p, token=selectors.token_get(p, pk))
    messages.success(request, f"Token {token} revoked.")
    return redirect("dashboard:tokens")


@page
def audit_log(request: HttpRequest, p: Principal) -> HttpResponse:
    p.require_any(Scope.AUDIT_READ)
    form = forms.AuditFilterForm(request.GET or None)
    events = selectors.audit_events_for(p)
    if form.is_valid():
        data = form.cleaned_data
        lookups = {
            "tenant_slug": data["tenant"],
            "actor_name": data["actor"],
            "action__startswith": data["action"],
            "occurred_at__gte": data["since"],
            "occurred_at__lt": data["until"],
        }
        events = events.filter(**{key: value for key, value in lookups.items() if value})
    page_obj = Paginator(events, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page_obj": page_obj,
        "query": query.urlencode(),
        "can_verify": p.sees_all(Scope.AUDIT_READ),
    }
    return render(request, "controlplane/audit_log.html", context)


@require_POST
@page
def audit_verify(request: HttpRequest, p: Principal) -> HttpResponse:
    p.require(Scope.AUDIT_READ)
    operation = operations.operation_start(actor=p, kind="audit.verify")
    return redirect("dashboard:operation", pk=operation.pk)


@page
def operation_detail(request: HttpRequest, p: Principal, pk: str) -> HttpResponse:
    operation = selectors.operation_get(p, pk)
    return render(request, "controlplane/operation.html", {"operation": operation})
