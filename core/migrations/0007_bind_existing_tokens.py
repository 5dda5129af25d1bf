"""Bind every existing token to one tenant where that is unambiguous.

- a tenant service account's token → the service account's tenant;
- a person's token, when the person is a member of exactly one tenant → that tenant;
- anything else (a person in several tenants or none, a platform service account) stays unbound: it
  keeps working on the API, but is no longer valid at the gateway until it is re-issued with a tenant.
"""

from django.db import migrations
from django.db.models import Count


def bind(apps, schema_editor):
    ApiToken = apps.get_model("controlplane", "ApiToken")
    Membership = apps.get_model("controlplane", "Membership")
    for token in ApiToken.objects.filter(service_account__tenant__isnull=False).select_related(
        "service_account"
    ):
        ApiToken.objects.filter(pk=token.pk).update(tenant_id=token.service_account.tenant_id)
    single = (
        Membership.objects.values("user_id").annotate(n=Count("id")).filter(n=1).values_list("user_id", flat=True)
    )
    for membership in Membership.objects.filter(user_id__in=list(single)):
        ApiToken.objects.filter(user_id=membership.user_id, tenant__isnull=True).update(
            tenant_id=membership.tenant_id
        )


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0006_invitations_and_token_tenant")]

    operations = [migrations.RunPython(bind, migrations.RunPython.noop)]
