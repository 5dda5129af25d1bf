from django.urls import include, path
from rest_framework.routers import SimpleRouter

from controlplane.api import views

app_name = "api"

router = SimpleRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register(r"tenants/(?P<tenant_slug>[-\w]+)/members", views.MemberViewSet, basename="member")
router.register(
    r"tenants/(?P<tenant_slug>[-\w]+)/invitations",
    views.TenantInvitationViewSet,
    basename="tenant-invitation",
)
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
