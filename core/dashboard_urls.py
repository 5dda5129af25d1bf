from django.urls import path

from core import views

# Included by the shell under the "dashboard" namespace, next to the fleet Overview at "/".
urlpatterns = [
    path("tenants/", views.tenant_list, name="tenants"),
    path("tenants/new/", views.tenant_create, name="tenant-create"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant"),
    path("tenants/<slug:slug>/edit/", views.tenant_edit, name="tenant-edit"),
    path("tenants/<slug:slug>/members/", views.member_set, name="member-set"),
    path("tenants/<slug:slug>/members/<str:username>/remove/", views.member_remove, name="member-remove"),
    path(
        "tenants/<slug:slug>/invitations/<int:pk>/withdraw/",
        views.invitation_withdraw,
        name="invitation-withdraw",
    ),
    path("tenants/<slug:slug>/service-accounts/", views.robot_create, name="robot-create"),
    path("tenants/<slug:slug>/secrets/", views.secret_put, name="secret-put"),
    path("tenants/<slug:slug>/secrets/<str:name>/delete/", views.secret_delete, name="secret-delete"),
    path("invitations/", views.invitation_list, name="invitations"),
    path(
        "invitations/<int:pk>/accept/",
        views.invitation_answer,
        {"answer": "accept"},
        name="invitation-accept",
    ),
    path(
        "invitations/<int:pk>/decline/",
        views.invitation_answer,
        {"answer": "decline"},
        name="invitation-decline",
    ),
    path("users/", views.user_list, name="users"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("audit/", views.audit_log, name="audit"),
    path("audit/verify/", views.audit_verify, name="audit-verify"),
    path("operations/<uuid:pk>/", views.operation_detail, name="operation"),
]
