from django.apps import AppConfig

from billing import hooks as billing_hooks
from regions import hooks as regions_hooks


class RoutingConfig(AppConfig):
    name = "routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The one import that must wait for ready(): the services use the models, loadable only now.
        from routing.services import republish_for_budgets, republish_when_serving_changes

        billing_hooks.on_budgets_fired(republish_for_budgets)
        regions_hooks.on_status_changed(republish_when_serving_changes)
