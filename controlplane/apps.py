from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Long-running operation handlers register themselves on import.
        from controlplane import checks  # noqa: F401
        from controlplane.services import audit_verification  # noqa: F401
