"""Validating rendered manifests against the schemas a cluster would: Kubernetes' own OpenAPI schemas
(kubernetes-validate, strict), KEDA's ScaledObject CRD, Gateway API's HTTPRoute CRD and the Inference
Extension's InferencePool CRD (their
openAPIV3Schema, with jsonschema).

The API server prunes fields a CRD's schema does not declare, or, with the strict field validation the
driver asks for, refuses them; plain JSON Schema would let them through, so the CRD's schema is read
strictly here: every object that declares its properties accepts no others.
"""

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

KEDA_CRD = Path(__file__).parent / "data" / "keda.sh_scaledobjects.yaml"  # KEDA v2.20.2
# Gateway API's standard channel, kubernetes-sigs/gateway-api at 4564255ac (its v1 HTTPRoute).
HTTPROUTE_CRD = Path(__file__).parent / "data" / "gateway.networking.k8s.io_httproutes.yaml"
# The Gateway API Inference Extension: kubernetes-sigs/gateway-api-inference-extension v1.6.0 (v1).
INFERENCE_POOL_CRD = Path(__file__).parent / "data" / "inference.networking.k8s.io_inferencepools.yaml"


def validate_kubernetes(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, kubernetes_validate.utils.latest_version(), strict=True)


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    open_ended = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_ended:
        strict["additionalProperties"] = False
    return strict


@cache
def _crd_validator(crd_file: Path, version_name: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(crd_file.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == version_name)
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _errors(validator: jsonschema.Draft7Validator, manifest: dict[str, Any]) -> list[str]:
    errors = validator.iter_errors(manifest)
    return sorted(f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors)


def scaled_object_errors(manifest: dict[str, Any]) -> list[str]:
    """What the ScaledObject CRD refuses in a manifest ([] when it validates), with each error's path."""
    return _errors(_crd_validator(KEDA_CRD, "v1alpha1"), manifest)


def http_route_errors(manifest: dict[str, Any]) -> list[str]:
    """What the HTTPRoute CRD (v1) refuses in a manifest ([] when it validates), with each error's path."""
    return _errors(_crd_validator(HTTPROUTE_CRD, "v1"), manifest)


def inference_pool_errors(manifest: dict[str, Any]) -> list[str]:
    """What the InferencePool CRD (v1) refuses in a manifest ([] when it validates), with error paths."""
    return _errors(_crd_validator(INFERENCE_POOL_CRD, "v1"), manifest)
