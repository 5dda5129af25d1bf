"""Where a deployment's scaling is decided, and what a scaling decision did."""

from django.db import models


class ScalerMode(models.TextChoices):
    """Who scales: the control plane's own autoscaler (every driver), or, in a Kubernetes region, an
    in-cluster HorizontalPodAutoscaler or KEDA ScaledObject rendered from the same policy."""

    CONTROL_PLANE = "control_plane", "Control plane"
    HPA = "hpa", "Kubernetes HPA"
    KEDA = "keda", "KEDA ScaledObject"


class DecisionKind(models.TextChoices):
    MANUAL = "manual", "Scaled by hand"
    SCALE_UP = "scale_up", "Scaled up"
    SCALE_DOWN = "scale_down", "Scaled down"
    SCALE_TO_ZERO = "scale_to_zero", "Scaled to zero (idle)"
    ACTIVATE = "activate", "Woken by a request"
    SCALE_OUT = "scale_out", "Scaled out to another region"
    CAPACITY_LIMITED = "capacity_limited", "Capacity-limited"
