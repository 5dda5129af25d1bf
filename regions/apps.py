from django.apps import AppConfig


class RegionsConfig(AppConfig):
    name = "regions"
    verbose_name = "Regions and deployments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The one import that must wait for ready() (usage uses the models): it registers with the
        # registry, which asks whether a version still serves before it may be retired.
        from regions import usage  # noqa: F401
