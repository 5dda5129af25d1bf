from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from core import selectors
from core.choices import AuditSource, TenantRole
from core.errors import ApplicationError
from core.models import ServiceAccount
from core.principal import Principal
from core.services.tenants import service_account_create
from core.services.tokens import token_create


class Command(BaseCommand):
    help = "Mint an API token for a user or a service account; prints only the secret on stdout."

    def add_arguments(self, parser: CommandParser) -> None:
        owner = parser.add_mutually_exclusive_group(required=True)
        owner.add_argument("--user", help="Username that owns the token")
        owner.add_argument("--service-account", metavar="TENANT/NAME", help="Created with --role if missing")
        parser.add_argument("--role", default=TenantRole.DEVELOPER, help="Role of a new service account")
        parser.add_argument(
            "--scopes", required=True, help="Comma-separated, e.g. registry:read,registry:write"
        )
        parser.add_argument("--name", default="cli")
        parser.add_argument(
            "--tenant", help="Bind a person's token to this tenant (needed for models:invoke)"
        )
        parser.add_argument("--expires-in-days", type=int)

    def _robot(self, actor: Principal, spec: str, role: str) -> ServiceAccount:
        slug, _, name = spec.rpartition("/")
        tenant = selectors.tenant_get(actor, slug) if slug and slug != "platform" else None
        robot = ServiceAccount.objects.filter(tenant=tenant, name=name).first()
        return robot or service_account_create(actor=actor, tenant=tenant, name=name, role=role)

    def handle(self, *args: Any, **opts: Any) -> None:
        system = Principal.system("create_token", source=AuditSource.COMMAND)
        days = opts["expires_in_days"]
        try:
            if opts["user"]:
                user = selectors.user_get(system, opts["user"])
                actor, robot = Principal.for_user(user, source=AuditSource.COMMAND), None
            else:
                actor, robot = system, self._robot(system, opts["service_account"], opts["role"])
            _, secret = token_create(
                actor=actor,
                name=opts["name"],
                scopes=opts["scopes"].split(","),
                service_account=robot,
                tenant=selectors.tenant_get(system, opts["tenant"], None) if opts.get("tenant") else None,
                expires_at=timezone.now() + timedelta(days=days) if days else None,
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(secret)
