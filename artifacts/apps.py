from django.apps import AppConfig

from regions import hooks as regions_hooks
from registry import hooks as registry_hooks


class ArtifactsConfig(AppConfig):
    name = "artifacts"
    verbose_name = "Model artifacts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The one import that must wait for ready(): the services use the models, loadable only now.
        from artifacts.services import scheduling

        # The registry announces new and staged versions: ingest them, copy them ahead.
        registry_hooks.on_register(scheduling.ingest_when_registered)
        registry_hooks.on_transition(scheduling.replicate_ahead_when_staged)
        # The reconciler asks whether a region's copy is verified; the process driver reads blobs from it.
        regions_hooks.provide_weights(scheduling.RegionalWeights())
