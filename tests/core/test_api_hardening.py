"""Hostile or malformed input answers 4xx with the error envelope, never 500 (issue 11, section 7)."""

import pytest

from core.choices import READ_SCOPES
from tests.support.envelope import assert_envelope
from tests.support.gateway import gateway_secret
from tests.support.principals import principal
from tests.support.registry import POLICY, register, version_payload

MODEL = "/api/v1/models/acme/llama-3-8b"


# --- lookups that are not of the key's type are 404, on every detail route -------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/tokens/abc/"),
        ("post", "/api/v1/tokens/abc/revoke/"),
        ("get", "/api/v1/tokens/1.5/"),
        ("get", "/api/v1/operations/not-a-uuid/"),
        ("get", "/api/v1/operations/12345/"),
        ("get", "/api/v1/service-accounts/abc/"),
        ("get", "/api/v1/artifacts/replicas/abc/retry/"),
    ],
)
def test_a_lookup_of_the_wrong_type_is_404(world, api, method, path):
    for user in (world.admin, world.dave):
        assert_envelope(getattr(api(user), method)(path), 404, "not_found")


def test_an_out_of_range_integer_lookup_is_404(world, api):
    assert_envelope(api(world.admin).get(f"/api/v1/tokens/{10**30}/"), 404, "not_found")


# --- query parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", ["abc", "0", "-3", "1.5", "100000000000000000000"])
def test_placement_with_bad_replicas_is_400(world, api, chat_model, replicas):
    register(chat_model, principal(world.alice))
    query = f"owner=acme&model=acme/llama-3-8b&version=1.0.0&replicas={replicas}"
    error = assert_envelope(api(world.alice).get(f"/api/v1/deployments/placement/?{query}"), 400, "invalid")
    assert "replicas" in error["message"]


@pytest.mark.parametrize("at", ["2026-11-03T14:00:00+25:00", "2026-13-45T99:00:00Z", "yesterday"])
def test_alias_at_that_is_not_a_time_is_400(world, api, chat_model, at):
    from urllib.parse import quote

    response = api(world.alice).get(f"{MODEL}/aliases/stable/?at={quote(at)}")
    if response.status_code == 404:  # no alias yet: make one, then ask again
        from registry.services.lifecycle import alias_move
        from tests.support.registry import advance

        version = advance(register(chat_model, principal(world.alice)), principal(world.alice), "staged")

        alias_move(actor=principal(world.alice), model=chat_model, name="stable", version=version, reason="t")
        response = api(world.alice).get(f"{MODEL}/aliases/stable/?at={quote(at)}")
    error = assert_envelope(response, 400, "invalid")
    assert "at=" in error["message"]


# --- a manifest that cannot be rendered is a clear 409 ----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_manifest_of_an_s3_version_on_a_process_region_without_store_is_409(world, api, make_region):
    from regions.services.deployments import deployment_create
    from registry.services.models import model_register
    from tests.support.registry import advance

    make_region("eu-west-1", "EU")
    op = principal(world.operator)
    model = model_register(actor=op, owner=None, name="tiny-s3", visibility="catalog")
    version = register(
        model,
        op,
        "1.0.0",
        parameter_count=3_000_000,
        max_context_length=512,
        engine_args={"max_model_len": 512},
        allowed_jurisdictions=["EU"],
    )
    advance(version, op, "production")
    deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, model=model, name="chat", version="1.0.0"
    )
    error = assert_envelope(
        api(world.alice).get("/api/v1/deployments/acme/chat/manifest/"), 409, "manifest_unavailable"
    )
    assert "eu-west-1" in error["message"] and "s3://" in error["message"]


# --- NUL characters: PostgreSQL cannot store them; the API refuses them up front --------------------

NUL = "\u0000"


def _nul_requests(world):
    """(user, method, path, body) writes with a NUL somewhere in a JSON object or string."""
    return [
        (world.alice, "post", "/api/v1/models/", {"owner": "acme", "name": "m", "labels": {"a": f"x{NUL}"}}),
        (world.alice, "post", "/api/v1/models/", {"owner": "acme", "name": "m", "labels": {f"k{NUL}": "v"}}),
        (
            world.alice,
            "post",
            "/api/v1/models/",
            {"owner": "acme", "name": "m", "validation_policy": [{"metric": f"mm{NUL}lu", "min": 1}]},
        ),
        (world.alice, "patch", MODEL + "/", {"labels": {"team": f"a{NUL}"}}),
        (world.alice, "post", MODEL + "/versions/", version_payload(engine_args={f"x{NUL}": 1})),
        (
            world.operator,
            "post",
            "/api/v1/regions/",
            {
                "code": "ap-1",
                "name": "AP",
                "provider": "aws",
                "jurisdiction": "JP",
                "driver": "process",
                "driver_config": {"state_dir": f"/tmp/{NUL}"},
            },
        ),
        (world.admin, "post", "/api/v1/tenants/", {"slug": "x", "name": f"X{NUL}", "residency": ["EU"]}),
    ]


@pytest.mark.parametrize("index", range(7))
def test_a_nul_anywhere_in_a_json_body_is_400(world, api, chat_model, index):
    user, method, path, body = _nul_requests(world)[index]
    response = getattr(api(user), method)(path, body, format="json")
    error = assert_envelope(response, 400, "malformed_request")
    assert "NUL" in error["message"]


def test_a_nul_in_a_report_hardware_is_400(world, api, chat_model):
    version = register(chat_model, principal(world.alice))
    from registry.services.lifecycle import version_transition

    version_transition(actor=principal(world.alice), version=version, to="validating", reason="t")
    body = {"metrics": {"mmlu": 0.7}, "hardware": {"gpu": f"L4{NUL}"}}
    response = api(world.alice).post(f"{MODEL}/versions/1.0.0/reports/", body, format="json")
    assert_envelope(response, 400, "malformed_request")


def test_an_escaped_backslash_u0000_is_not_a_nul(world, api):
    body = '{"slug": "x", "name": "X\\\\u0000", "residency": ["EU"]}'
    response = api(world.admin).post("/api/v1/tenants/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "X\\u0000"


@pytest.mark.parametrize(
    "path", ["/api/v1/models/?q=%00", "/api/v1/tenants/a%00b/", "/api/v1/models/acme/x%00/"]
)
def test_a_nul_in_the_path_or_query_is_400(world, api, path):
    assert_envelope(api(world.alice).get(path), 400, "malformed_request")


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/tenants/new/", {"slug": "nul", "name": f"N{NUL}", "residency": ["EU"], "budget_currency": "USD"}),
        ("/deployments/new/", {"owner": f"acme{NUL}", "name": "chat", "replicas": "1"}),
        ("/registry/", {"owner": "acme", "name": "nul", "task": "chat", "description": f"a{NUL}"}),
        ("/tokens/", {"name": f"t{NUL}", "owner": "me", "scopes": ["registry:read"]}),
        ("/tenants/acme/members/", {"username": f"dave{NUL}", "role": "viewer"}),
    ],
)
def test_a_nul_in_a_console_form_is_refused_with_a_message(world, client, path, data):
    from core.models import AuditEvent

    client.force_login(world.admin)
    before = AuditEvent.objects.count()
    response = client.post(path, data)
    assert response.status_code == 400
    assert b"NUL characters are not allowed" in response.content
    assert AuditEvent.objects.count() == before


def test_deeply_nested_json_is_400(world, api):
    body = "[" * 100_000 + "]" * 100_000
    response = api(world.admin).post("/api/v1/tenants/", body, content_type="application/json")
    assert_envelope(response, 400, "malformed_request")


def test_a_body_over_the_upload_limit_is_413_before_it_is_read(world, api, client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = '{"name": "' + "x" * 4096 + '", "scopes": ["registry:read"]}'
    assert_envelope(
        api(world.alice).post("/api/v1/tokens/", body, content_type="application/json"),
        413,
        "request_too_large",
    )
    client.force_login(world.alice)
    page = client.post("/tokens/", {"name": "x" * 4096, "owner": "me", "scopes": ["registry:read"]})
    assert page.status_code == 413 and b"at most 1024" in page.content


# --- a principal who may see the tenant but lacks the scope gets 403, not 404 ----------------------


def _read_only(api, user, scopes=None):
    held = principal(user).all_scopes & READ_SCOPES
    return api(user, scopes=scopes or sorted(held - {"tenants:read"}))


@pytest.mark.parametrize("scopes", [None, ["registry:read"], ["tenants:read", "registry:read"]])
def test_a_read_only_token_writing_is_403_naming_the_scope(world, api, chat_model, scopes):
    client = _read_only(api, world.dave, scopes)
    for path, body in [
        ("/api/v1/models/", {"owner": "acme", "name": "m", "task": "chat", "validation_policy": POLICY}),
        ("/api/v1/service-accounts/", {"tenant": "acme", "name": "bot", "role": "viewer"}),
        ("/api/v1/deployments/", {"owner": "acme", "name": "d", "model": "acme/llama-3-8b", "version": "1"}),
    ]:
        error = assert_envelope(client.post(path, body, format="json"), 403, "forbidden")
        assert error["detail"]["scope"]


def test_writing_into_a_tenant_one_may_not_see_stays_404(world, api):
    bob = api(world.bob)
    for path, body in [
        ("/api/v1/models/", {"owner": "acme", "name": "m", "task": "chat"}),
        ("/api/v1/service-accounts/", {"tenant": "acme", "name": "bot", "role": "viewer"}),
        ("/api/v1/deployments/", {"owner": "acme", "name": "d", "model": "acme/m", "version": "1"}),
    ]:
        assert_envelope(bob.post(path, body, format="json"), 404, "not_found")


# --- schema and output agree on budget_webhook ------------------------------------------------------


def test_budget_webhook_schema_allows_what_the_api_returns(world, api):
    import yaml

    schema = yaml.safe_load(api(world.admin).get("/api/schema/").content)
    field = schema["components"]["schemas"]["Tenant"]["properties"]["budget_webhook"]
    value = api(world.admin).get("/api/v1/tenants/acme/").json()["budget_webhook"]
    assert value in ("", None)
    import jsonschema

    checker = jsonschema.FormatChecker()
    checker.checks("uri")(lambda v: not isinstance(v, str) or "://" in v)
    jsonschema.validate(value, field, format_checker=checker)


# --- query parameters the schema did not declare (so a fuzzer never tried them) ---------------------


@pytest.mark.parametrize(
    "query",
    [
        "/api/v1/costs/?month=9999-12",
        "/api/v1/costs/?month=0000-01",
        "/api/v1/costs/idle/?hours=1e3",
        "/api/v1/costs/crosscheck/?region=eu-west-1&minutes=abc",
        "/api/v1/routing/table/?wait=nan",
        "/api/v1/routing/table/?wait=inf",
        "/api/v1/routing/table/?wait=1e400",
        "/api/v1/routing/gateway-config/?wait=nan",
    ],
)
def test_bad_query_parameters_are_400(world, api, make_region, query):
    make_region("eu-west-1", "EU")
    client = api(secret=gateway_secret(world)) if "gateway-config" in query else api(world.admin)
    if "routing" in query:  # long-poll on the current table: a NaN wait used to loop forever
        etag = client.get(query.split("?")[0])["ETag"]
        response = client.get(query, HTTP_IF_NONE_MATCH=etag)
    else:
        response = client.get(query)
    assert_envelope(response, 400, "invalid")


@pytest.mark.parametrize(
    "path", ["/costs/?month=9999-12", "/deployments/new/?replicas=abc", "/deployments/new/?replicas=-1"]
)
def test_console_pages_with_bad_query_parameters_do_not_fail(world, client, chat_model, path):
    from tests.support.registry import advance

    advance(register(chat_model, principal(world.alice)), principal(world.alice), "production")
    client.force_login(world.alice)
    assert client.get(path).status_code == 200


# --- times: offsets PostgreSQL refuses, instants before year 1 ---------------------------------------


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("since=2026-01-01T00:00:00-19:38", 200),
        ("until=2026-01-01T00:00:00%2B18:00", 200),
        ("until=0001-01-01T00:00:00%2B05:00", 400),
    ],
)
def test_audit_filters_take_any_offset_python_accepts(world, api, client, query, status):
    assert api(world.admin).get(f"/api/v1/audit-events/?{query}").status_code == status
    assert api(world.admin).get(f"/api/v1/audit-events/export/?{query}").status_code == status
    client.force_login(world.admin)
    assert client.get(f"/audit/?{query}").status_code == 200  # the console shows the form's error


def test_alias_at_with_an_offset_postgresql_refuses_is_answered(world, api, chat_model):
    from registry.services.lifecycle import alias_move
    from tests.support.registry import advance

    version = advance(register(chat_model, principal(world.alice)), principal(world.alice), "staged")
    alias_move(actor=principal(world.alice), model=chat_model, name="stable", version=version, reason="t")
    response = api(world.alice).get(f"{MODEL}/aliases/stable/?at=2999-01-01T00:00:00-19:38")
    assert response.status_code == 200, response.content
    assert response.json()["version"] == "1.0.0"
    assert_envelope(
        api(world.alice).get(f"{MODEL}/aliases/stable/?at=0001-01-01T00:00:00%2B05:00"), 400, "invalid"
    )


@pytest.mark.parametrize("header", ["HTTP_IDEMPOTENCY_KEY", "HTTP_AUTHORIZATION", "HTTP_IF_MATCH"])
def test_a_nul_in_a_header_is_400(world, api, header):
    client = api() if header == "HTTP_AUTHORIZATION" else api(world.admin)
    value = f"Bearer x{NUL}" if header == "HTTP_AUTHORIZATION" else f"k{NUL}"
    body = {"slug": "initech", "name": "Initech", "residency": ["UK"]}
    response = client.post("/api/v1/tenants/", body, format="json", **{header: value})
    assert_envelope(response, 400, "malformed_request")
