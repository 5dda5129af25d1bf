from django.apps import AppConfig

from regions import hooks as regions_hooks


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The one import that must wait for ready(): metering uses the models, loadable only now.
        from billing.metering import record_allocations

        # The reconciler reports the GPUs each target holds after every pass: billed capacity.
        regions_hooks.on_allocation(record_allocations)
