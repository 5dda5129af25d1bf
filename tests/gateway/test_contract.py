"""gateway/contract.py is the whole wire between the control plane and its gateways: what either side
sends has exactly the contract's fields, the gateway imports nothing of Django or the control plane, and
the control plane imports nothing of the gateway but the contract (and the public-address rule the
gateway's http stages and the control plane's webhooks share, gateway/addresses.py)."""

import ast
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.choices import AuditSource, Scope
from core.principal import Principal
from core.services.tokens import token_create
from gateway import addresses, contract
from gateway.app import Gateway, Reply
from gateway.config import Settings
from gateway.metering import Outcome
from routing import services
from routing.routes import TenantPolicy, route_table
from tests.support.routes import placement

ROOT = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ("controlplane", "registry", "regions", "artifacts", "billing", "routing", "core")


def _keys(shape: Any) -> frozenset[str]:
    return frozenset(shape.__required_keys__ | shape.__optional_keys__)


def _imports(package: str) -> dict[str, set[str]]:
    """file -> every module it imports (at any depth, typing-only imports included)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        found[str(path.relative_to(ROOT))] = names
    return found


def test_the_gateway_imports_nothing_of_django_or_the_control_plane() -> None:
    forbidden = ("django", "rest_framework", *CONTROL_PLANE)
    found = {
        path: sorted(name for name in names if name.split(".")[0] in forbidden)
        for path, names in _imports("gateway").items()
    }
    assert not {path: names for path, names in found.items() if names}


def test_the_control_plane_imports_only_the_contract_and_the_address_rule_of_the_gateway() -> None:
    # gateway/addresses.py is the one rule of which addresses are public, for the http stages and webhooks.
    shared = {"contract": contract, "addresses": addresses}
    allowed = {"gateway"} | {
        f"gateway.{module}{suffix}"
        for module, mod in shared.items()
        for suffix in ["", *(f".{n}" for n in vars(mod))]
    }
    found = {}
    for package in CONTROL_PLANE:
        if not (ROOT / package).is_dir():
            continue
        for path, names in _imports(package).items():
            outside = sorted(n for n in names if n.split(".")[0] == "gateway" and n not in allowed)
            if outside:
                found[path] = outside
    assert not found


def test_the_route_table_has_exactly_the_contracts_fields() -> None:
    policies = [
        TenantPolicy("acme", frozenset({"EU"}), limits={"requests_per_minute": 60}, degraded="budget")
    ]
    served = route_table(policies, [placement()])["acme"]
    assert set(served) == _keys(contract.TenantRoutes) - {"pipelines"}  # added with the tenant's pipelines
    with_fallback = route_table(policies, [placement(fallbacks=("small",)), placement(name="small")])
    assert with_fallback["acme"]["models"]["chat"]["fallbacks"] == ["small"]
    assert set(served["limits"]) <= _keys(contract.TenantLimits)
    route = served["models"]["chat"]
    assert set(route) == contract.Route.__required_keys__  # served: no "unavailable"
    # Every field but the engines' key: only the gateways' copy has it (routing.selectors.for_gateways).
    assert set(route["endpoints"][0]) == _keys(contract.Endpoint) - {"api_key"}
    unserved = route_table(policies, [placement(ready=False)])["acme"]["models"]["chat"]
    assert set(unserved) == _keys(contract.Route) - {
        "splits",
        "activatable",
        "fallbacks",
        "cache",
    }  # no rollout, not idle, no response cache
    idle = placement(ready=False, endpoints=(), activatable=True)
    at_zero = route_table(policies, [idle])["acme"]["models"]["chat"]
    assert set(at_zero) == _keys(contract.Route) - {"splits", "fallbacks", "cache"}
    assert set(at_zero["activatable"]) == _keys(contract.Activatable)
    candidate = placement(track=contract.CANDIDATE, traffic_percent=10, region="eu-west-1")
    rolling = route_table(policies, [placement(), candidate])["acme"]["models"]["chat"]
    assert set(rolling) == _keys(contract.Route) - {"unavailable", "activatable", "fallbacks", "cache"}
    assert set(rolling["splits"]["eu-west-1"]) == _keys(contract.Split)
    opted_in = [replace(policies[0], response_cache={"chat": 60})]
    cached = route_table(opted_in, [placement(production=True)])["acme"]["models"]["chat"]["cache"]
    assert set(cached) == _keys(contract.ResponseCache) and cached["ttl_seconds"] == 60
    assert set(cached["places"][0]) == _keys(contract.CachePlace)


def test_a_published_table_has_exactly_the_contracts_parts(world) -> None:  # type: ignore[no-untyped-def]
    alice = Principal.for_user(world.alice, source=AuditSource.API)
    token_create(actor=alice, name="app", scopes=[Scope.MODELS_INVOKE], tenant=world.tenant_a)
    body = services.publish().body
    assert set(body) == _keys(contract.RouteTable)
    (credential,) = body["credentials"].values()
    assert set(credential) == _keys(contract.Credential)


def test_the_gateway_sends_every_usage_field_the_control_plane_takes(tmp_path: Path) -> None:
    gateway = Gateway(
        Settings(control_plane="http://127.0.0.1:1", token="", cache_file=None, state_dir=tmp_path)
    )
    sent: list[contract.UsageRecord] = []
    gateway.usage.record = sent.append  # type: ignore[method-assign]
    route = route_table([TenantPolicy("acme", frozenset({"EU"}))], [placement()])["acme"]["models"]["chat"]
    seen = Outcome(
        route["endpoints"][0],
        status=200,
        usage={"prompt_tokens": 3},
        ttft_ms=12.5,
        attempt=2,
        candidate_errors=1,
    )
    reply = Reply(None, "r1")
    reply.degraded, reply.served_name = contract.CAPACITY, "small"  # served by a fallback: every field
    reply.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"  # and traced
    reply.pipeline = ("acme/support@1.0.0", "answer")  # and a pipeline's stage
    gateway._meter(
        reply, "acme", "chat", {}, "interactive", seen, time.perf_counter(), datetime.now(UTC), False
    )
    (record,) = sent
    assert set(record) == contract.USAGE_FIELDS
    assert {"request_id", "tenant", "started_at"} == contract.USAGE_REQUIRED_FIELDS


def test_the_activation_a_gateway_sends_is_exactly_what_the_api_takes() -> None:
    from routing.api.serializers import ActivationSerializer

    assert set(ActivationSerializer().fields) == _keys(contract.Activation)
