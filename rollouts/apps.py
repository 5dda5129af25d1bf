from django.apps import AppConfig

from regions import hooks as regions_hooks
from registry import hooks as registry_hooks


class RolloutsConfig(AppConfig):
    name = "rollouts"
    verbose_name = "Rollouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The one import that must wait for ready(): the services use the models, loadable only now.
        from rollouts.services.machine import alias_follow_veto, evidence_of

        registry_hooks.on_production_evidence(evidence_of)
        regions_hooks.on_alias_follow(alias_follow_veto)
