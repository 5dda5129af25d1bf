import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from core import selectors
from core.choices import AuditSource, PlatformRole
from core.errors import ApplicationError
from core.principal import Principal
from core.services.tenants import membership_set
from core.services.users import user_create


class Command(BaseCommand):
    help = (
        "Create a user with a platform role and/or tenant memberships (password from $CONTROLPLANE_PASSWORD)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument("--platform-role", default="", choices=PlatformRole.values)
        parser.add_argument(
            "--member", action="append", default=[], metavar="TENANT:ROLE", help="Repeatable, e.g. acme:admin"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        actor = Principal.system("create_user", source=AuditSource.COMMAND)
        try:
            with transaction.atomic():
                user = user_create(
                    actor=actor,
                    username=opts["username"],
                    email=opts["email"],
                    password=os.environ.get("CONTROLPLANE_PASSWORD"),
                    platform_role=opts["platform_role"],
                )
                for spec in opts["member"]:
                    slug, _, role = spec.partition(":")
                    membership_set(
                        actor=actor, tenant=selectors.tenant_get(actor, slug), user=user, role=role
                    )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Created user {user.username}")
