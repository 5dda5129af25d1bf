from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Long-running operation handlers register themselves on import, and so does the Celery task
        # that runs them (operation_start enqueues through it).
        from controlplane import checks, tasks  # noqa: F401
        from controlplane.services import audit_verification  # noqa: F401
