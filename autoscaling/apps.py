from django.apps import AppConfig

from regions import hooks as regions_hooks


class AutoscalingConfig(AppConfig):
    name = "autoscaling"
    verbose_name = "Autoscaling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The imports that must wait for ready(): they use the models, loadable only now.
        from autoscaling.kubernetes import in_cluster_scalers
        from autoscaling.services.decisions import record_scaled

        regions_hooks.on_scaled(record_scaled)
        regions_hooks.on_in_cluster_scaler(in_cluster_scalers)
