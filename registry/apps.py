from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from registry import checks  # noqa: F401  (registers the configuration checks)
