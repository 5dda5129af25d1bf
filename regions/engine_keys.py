"""Every deployment's engines answer only callers holding its API key: the gateways.

vLLM guards its OpenAI endpoints (``/v1/...``) with ``VLLM_API_KEY`` (``/health`` and ``/metrics`` stay
open for probes and Prometheus). The key of a deployment is derived, never stored: an HMAC of its id
under ``ENGINE_KEY_SECRET`` (default: ``SECRET_KEY``). The drivers give it to the engines (the process
driver in the engine's environment, the Kubernetes driver in a Secret the pods read), and the route
table carries it only to gateways (``GET /api/v1/routing/gateway-config/``, scope ``gateway:sync``; the
table stored and shown to people has none), which send it as ``Authorization: Bearer``. A deployment's
workload carries the key's fingerprint, so a new root key restarts its engines with the new key.
"""

import hashlib

from django.conf import settings
from django.utils.crypto import salted_hmac

from regions.drivers.base import WorkloadSpec

DEPLOYMENT_LABEL = "controlplane.io/deployment"


def engine_api_key(deployment_id: int) -> str:
    return salted_hmac(
        "controlplane.engine-api-key",
        str(deployment_id),
        secret=settings.ENGINE_KEY_SECRET,
        algorithm="sha256",
    ).hexdigest()


def key_fingerprint(deployment_id: int) -> str:
    """Names the key without giving it away (in the workload, so a new key restarts the engines)."""
    return hashlib.sha256(engine_api_key(deployment_id).encode()).hexdigest()[:16]


def workload_api_key(spec: WorkloadSpec) -> str:
    """The key the engines of a workload start with ('' for a workload of no deployment: tests, tools)."""
    deployment = spec.labels.get(DEPLOYMENT_LABEL, "")
    return engine_api_key(int(deployment)) if deployment.isdigit() and spec.api_key_id else ""
