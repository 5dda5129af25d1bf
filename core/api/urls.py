from typing import Any

from django.db import models
from django.urls import include, path
from rest_framework.routers import SimpleRouter

from core.api import views

app_name = "api"

UUID_PATTERN = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"


class TypedLookupRouter(SimpleRouter):
    """Detail routes keyed by the primary key match only keys of its type (digits for integer keys, a
    UUID for UUID keys), so ``/tokens/abc/`` or ``/operations/not-a-uuid/`` is a 404 before a view or
    query runs, on every viewset registered here."""

    def get_lookup_regex(self, viewset: Any, lookup_prefix: str = "") -> str:
        model = getattr(getattr(getattr(viewset, "serializer_class", None), "Meta", None), "model", None)
        keyed_by_pk = getattr(viewset, "lookup_field", "pk") == "pk"
        if getattr(viewset, "lookup_value_regex", None) is None and keyed_by_pk and model is not None:
            pk = model._meta.pk
            if isinstance(pk, models.UUIDField):
                viewset.lookup_value_regex = UUID_PATTERN
            elif isinstance(pk, models.AutoField | models.BigAutoField | models.IntegerField):
                viewset.lookup_value_regex = "[0-9]+"
        return super().get_lookup_regex(viewset, lookup_prefix)


router = TypedLookupRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register(r"tenants/(?P<tenant_slug>[-\w]+)/members", views.MemberViewSet, basename="member")
router.register(
    r"tenants/(?P<tenant_slug>[-\w]+)/invitations",
    views.TenantInvitationViewSet,
    basename="tenant-invitation",
)
router.register(r"tenants/(?P<tenant_slug>[-\w]+)/secrets", views.SecretViewSet, basename="secret")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("users", views.UserViewSet, basename="user")
router.register("service-accounts", views.ServiceAccountViewSet, basename="service-account")
router.register("tokens", views.TokenViewSet, basename="token")
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")
router.register("operations", views.OperationViewSet, basename="operation")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("", include(router.urls)),
]
