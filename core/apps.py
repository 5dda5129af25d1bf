from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Tenants, users, tokens, audit and operations: what every other app builds on.

    The label stays ``controlplane``: the tables, migrations and permissions were created under it when this
    code lived in the project package, and keeping it keeps every existing database as it is."""

    name = "core"
    label = "controlplane"
    verbose_name = "Control plane core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django's idiom: modules that register system checks, operation handlers and tasks on import.
        from core import checks, tasks  # noqa: F401
        from core.services import audit_verification  # noqa: F401
