from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.choices import AuditSource
from core.errors import ApplicationError
from core.principal import Principal
from core.services.tenants import tenant_create


class Command(BaseCommand):
    help = "Create a tenant with its data-residency policy."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument(
            "--residency", required=True, help="Comma-separated jurisdiction codes, e.g. EU,CH"
        )
        parser.add_argument("--home-region", default="")
        parser.add_argument("--max-gpus", type=int)
        parser.add_argument("--monthly-budget")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            tenant = tenant_create(
                actor=Principal.system("create_tenant", source=AuditSource.COMMAND),
                slug=opts["slug"],
                name=opts["name"],
                residency=opts["residency"].split(","),
                home_region=opts["home_region"],
                max_gpus=opts["max_gpus"],
                monthly_budget=opts["monthly_budget"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Created tenant {tenant.slug} (residency {','.join(tenant.residency)})")
