"""The registry's REST API as CI uses it: registration, reports, transitions, aliases, diff, lineage."""

import pytest

from core.models import AuditEvent
from registry.models import ModelVersion
from tests.support.registry import GOOD_METRICS, POLICY, version_payload

BASE = "/api/v1/models/acme/llama-3-8b"


@pytest.fixture
def ci(world, api, chat_model):
    """The tenant's CI robot (developer role) with the registry scopes."""
    from core.services.tokens import token_create
    from tests.support.principals import principal

    _, secret = token_create(
        actor=principal(world.alice),
        name="ci",
        service_account=world.robot_a,
        scopes=["registry:read", "registry:write", "registry:promote"],
    )
    return api(secret=secret)


def test_register_model_and_version(world, api):
    client = api(world.alice)
    created = client.post(
        "/api/v1/models/",
        {"owner": "acme", "name": "mistral-7b", "task": "chat", "validation_policy": POLICY},
        format="json",
    )
    assert created.status_code == 201 and created.json()["ref"] == "acme/mistral-7b"
    version = client.post("/api/v1/models/acme/mistral-7b/versions/", version_payload(), format="json")
    assert version.status_code == 201
    body = version.json()
    assert body["status"] == "draft" and body["created_by_name"] == "alice"
    assert body["weights_check"] == "declared"  # the tests run without ingest on registration
    assert body["sizing"]["smallest_fit"] == {"gpu_type": "L4", "gpu_count": 1, "memory_gib": 24}


def test_registration_is_idempotent_and_conflicts_on_other_bytes(ci):
    first = ci.post(f"{BASE}/versions/", version_payload(), format="json")
    again = ci.post(f"{BASE}/versions/", version_payload(), format="json")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["created_at"] == first.json()["created_at"]
    assert ModelVersion.objects.filter(version="1.0.0").count() == 1
    assert AuditEvent.objects.filter(action="model_version.registered").count() == 1
    other = ci.post(f"{BASE}/versions/", version_payload(sha="f" * 64), format="json")
    assert other.status_code == 409 and other.json()["error"]["code"] == "version_exists"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"artifact_sha256": "xyz"}, "artifact_sha256"),
        ({"artifact_sha256": "a" * 63}, "artifact_sha256"),
        ({"artifact_size_bytes": -5}, "artifact_size_bytes"),
        ({"engine_args": {"tensor_paralel_size": 2}}, "tensor_paralel_size"),
        ({"engine_args": {"max_model_len": "long"}}, "max_model_len"),
        ({"engine_args": {"max_model_len": 100000}}, "max_model_len"),
        ({"artifact_uri": "ftp://x/y"}, "artifact_uri"),
        ({"version": "../1"}, "version"),
        ({"allowed_jurisdictions": ["EU", "MARS"]}, "allowed_jurisdictions"),
        ({"dtype": "int3"}, "dtype"),
        ({"artifact_manifest": [{"path": "../etc/passwd"}]}, "artifact_manifest"),
        ({"max_context_length": -1}, "max_context_length"),
        ({"colour": "blue"}, "colour"),
        ({"weights_check": "verified"}, "weights_check"),  # only ingest verifies
    ],
)
def test_bad_versions_are_400_naming_the_problem_and_write_nothing(ci, overrides, field):
    events = AuditEvent.objects.count()
    response = ci.post(f"{BASE}/versions/", version_payload(**overrides), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["message"] or field in str(response.json()["error"]["detail"])
    assert not ModelVersion.objects.exists() and AuditEvent.objects.count() == events


def test_ci_flow_through_the_api(ci, world, api):
    ci.post(f"{BASE}/versions/", version_payload(), format="json")
    url = f"{BASE}/versions/1.0.0"
    illegal = ci.post(f"{url}/transitions/", {"to": "production"}, format="json")
    assert illegal.status_code == 409 and illegal.json()["error"]["code"] == "invalid_transition"
    assert illegal.json()["error"]["detail"] == {"current": "draft", "allowed": ["validating"]}
    assert (
        ci.post(f"{url}/transitions/", {"to": "validating"}, format="json").json()["status"] == "validating"
    )
    report = ci.post(
        f"{url}/reports/", {**GOOD_METRICS, "hardware": {"gpu_type": "L4", "gpu_count": 1}}, format="json"
    )
    assert report.status_code == 201 and report.json()["outcome"] == "passed"
    for state in ("validated", "staged", "canary"):
        moved = ci.post(
            f"{url}/transitions/", {"to": state}, format="json", HTTP_IDEMPOTENCY_KEY=f"to-{state}"
        )
        assert moved.json()["status"] == state
    replay = ci.post(f"{url}/transitions/", {"to": "canary"}, format="json", HTTP_IDEMPOTENCY_KEY="to-canary")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    robot_override = ci.post(
        f"{url}/transitions/", {"to": "production", "override": True, "reason": "ok"}, format="json"
    )
    assert robot_override.status_code == 403  # a developer robot may not skip the canary gate
    admin = api(world.alice)
    done = admin.post(
        f"{url}/transitions/", {"to": "production", "override": True, "reason": "SLOs green"}, format="json"
    )
    assert done.status_code == 200 and done.json()["status"] == "production"
    history = ci.get(f"{url}/transitions/").json()
    assert [h["to_status"] for h in history] == ["validating", "validated", "staged", "canary", "production"]
    aliases = {a["name"]: a["version"] for a in ci.get(f"{BASE}/aliases/").json()}
    assert aliases["production"] == "1.0.0"


def test_alias_api_with_point_in_time_query(ci, chat_model, world):
    from tests.support.principals import principal
    from tests.support.registry import advance, register

    advance(register(chat_model, principal(world.alice), "1.0.0"), principal(world.alice), "validated")
    missing = ci.put(f"{BASE}/aliases/stable/", {"version": "9.9.9"}, format="json")
    assert missing.status_code == 400 and "9.9.9" in missing.json()["error"]["message"]
    moved = ci.put(f"{BASE}/aliases/stable/", {"version": "1.0.0", "reason": "pin"}, format="json")
    assert moved.status_code == 200 and moved.json()["version"] == "1.0.0"
    assert ci.get(f"{BASE}/aliases/stable/?at=2000-01-01T00:00:00Z").json()["version"] is None
    assert ci.get(f"{BASE}/aliases/stable/?at=2999-01-01T00:00:00Z").json()["version"] == "1.0.0"
    assert ci.get(f"{BASE}/aliases/stable/?at=yesterday").status_code == 400
    history = ci.get(f"{BASE}/aliases/stable/history/").json()
    assert history[0]["version"] == "1.0.0" and history[0]["reason"] == "pin"
    builtin = ci.put(f"{BASE}/aliases/production/", {"version": "1.0.0"}, format="json")
    assert builtin.status_code == 409


def test_content_is_immutable_after_draft_but_governance_is_not(ci):
    ci.post(f"{BASE}/versions/", version_payload(), format="json")
    url = f"{BASE}/versions/1.0.0/"
    assert ci.patch(url, {"engine_args": {"max_model_len": 4096}}, format="json").status_code == 200
    ci.post(f"{url}transitions/", {"to": "validating"}, format="json")
    frozen = ci.patch(url, {"engine_args": {"max_model_len": 2048}}, format="json")
    assert frozen.status_code == 409 and frozen.json()["error"]["code"] == "immutable"
    governance = ci.patch(url, {"allowed_jurisdictions": ["EU"]}, format="json")
    assert governance.status_code == 200 and governance.json()["allowed_jurisdictions"] == ["EU"]
    assert ModelVersion.objects.get().engine_args["max_model_len"] == 4096


@pytest.mark.parametrize(
    "change",
    [
        {"artifact_sha256": "b" * 64},
        {"artifact_uri": "s3://models/other/"},
        {"artifact_manifest": []},
        {"artifact_size_bytes": 1},
        {"artifact_format": "gguf"},
    ],
)
def test_a_versions_weights_are_fixed_at_registration_even_in_draft(ci, change):
    """Ingest checks them against their source and replication copies them by digest: an edit after
    registration would carry another tenant's digest past both."""
    created = ci.post(f"{BASE}/versions/", version_payload(), format="json").json()
    edited = ci.patch(f"{BASE}/versions/1.0.0/", change, format="json")
    assert edited.status_code == 409 and edited.json()["error"]["code"] == "immutable"
    assert "Register a new version" in edited.json()["error"]["message"]
    after = ci.get(f"{BASE}/versions/1.0.0/").json()
    assert {name: after[name] for name in change} == {name: created[name] for name in change}


def test_diff_and_lineage(ci):
    ci.post(f"{BASE}/versions/", version_payload(), format="json")
    ci.post(
        f"{BASE}/versions/",
        version_payload("1.1.0", sha="d" * 64, parent_version="1.0.0", engine_args={"max_model_len": 4096}),
        format="json",
    )
    diff = ci.get(f"{BASE}/diff/?from=1.0.0&to=1.1.0").json()
    engine = {c["field"]: (c["from"], c["to"]) for c in diff["sections"]["engine_args"]}
    assert engine["engine_args.max_model_len"] == (8192, 4096)
    assert engine["engine_args.enable_prefix_caching"] == (True, None)
    assert any(c["field"] == "artifact_sha256" for c in diff["sections"]["artifact"])
    assert diff["manifest"]["changed"] == ["model-00001-of-00004.safetensors"]
    lineage = ci.get(f"{BASE}/versions/1.1.0/lineage/").json()["lineage"]
    assert [entry["version"] for entry in lineage] == ["1.1.0", "1.0.0"]
    assert ci.get(f"{BASE}/diff/?from=1.0.0").status_code == 400


def test_model_update_uses_etags(world, api, chat_model):
    client = api(world.alice)
    tag = client.get(f"{BASE}/")["ETag"]
    ok = client.patch(f"{BASE}/", {"description": "Llama 3 8B"}, format="json", HTTP_IF_MATCH=tag)
    assert ok.status_code == 200
    stale = client.patch(f"{BASE}/", {"description": "stale"}, format="json", HTTP_IF_MATCH=tag)
    assert stale.status_code == 412
    bad_policy = client.patch(f"{BASE}/", {"validation_policy": [{"metric": "x"}]}, format="json")
    assert bad_policy.status_code == 400


def test_engine_argument_schema_is_published(ci):
    schema = ci.get("/api/v1/engine-arguments/").json()
    assert schema["arguments"]["tensor_parallel_size"]["type"] == "int"
    assert "awq" in schema["arguments"]["quantization"]["choices"]


def test_tenants_cannot_publish_to_the_catalog(world, api):
    response = api(world.alice).post(
        "/api/v1/models/", {"owner": "acme", "name": "x", "visibility": "catalog"}, format="json"
    )
    assert response.status_code == 400 and "catalog" in response.json()["error"]["message"]
