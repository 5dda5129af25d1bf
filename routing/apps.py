from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from billing.hooks import on_budgets_fired
        from routing.services import publish

        @on_budgets_fired
        def republish(alerts: object) -> None:
            publish()  # a hard limit reaches the gateways with the next table generation
