from django.apps import AppConfig

from billing import hooks as billing_hooks


class RoutingConfig(AppConfig):
    name = "routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The one import that must wait for ready(): the services use the models, loadable only now.
        from routing.services import publish

        @billing_hooks.on_budgets_fired
        def republish(alerts: object) -> None:
            publish()  # a hard limit reaches the gateways with the next table generation
