"""Validating rendered manifests against the schemas a cluster would: Kubernetes' own OpenAPI schemas
(kubernetes-validate, strict), KEDA's ScaledObject CRD and Gateway API's HTTPRoute CRD (their
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
def _scaled_object_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def scaled_object_errors(manifest: dict[str, Any]) -> list[str]:
    """What the ScaledObject CRD refuses in a manifest ([] when it validates), with each error's path."""
    errors = _scaled_object_validator().iter_errors(manifest)
    return sorted(f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors)


@cache
def _http_route_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(HTTPROUTE_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def http_route_errors(manifest: dict[str, Any]) -> list[str]:
    """What the HTTPRoute CRD (v1) refuses in a manifest ([] when it validates), with each error's path."""
    errors = _http_route_validator().iter_errors(manifest)
    return sorted(f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in errors)
