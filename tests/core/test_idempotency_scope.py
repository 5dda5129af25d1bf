"""Idempotency records never hold a secret, belong to the credential and endpoint that made them, and a
replay passes the same permission checks as the original request."""

import json

from core.choices import TenantRole
from core.models import IdempotencyRecord, Membership
from tests.support.principals import mint

NEW_TOKEN = {"name": "ci", "scopes": ["registry:read"]}


def _rows() -> str:
    return json.dumps(list(IdempotencyRecord.objects.values()), default=str)


def test_the_database_never_holds_a_token_secret(world, api):
    client = api(world.alice)
    first = client.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    assert first.status_code == 201
    secret = first.json()["secret"]
    assert secret.startswith("cpt_")
    assert IdempotencyRecord.objects.count() == 1
    assert secret not in _rows()
    # The part after cpt_<prefix>_ (itself URL-safe base64, which may hold "_": never split on it).
    assert secret.removeprefix("cpt_").split("_", 1)[1] not in _rows()

    again = client.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    body = again.json()
    assert body["id"] == first.json()["id"] and body["prefix"] == first.json()["prefix"]
    assert body["secret"] is None
    assert "shown only once" in body["secret_redacted"]


def test_a_read_only_token_of_the_same_user_cannot_replay_a_write_key(world, api):
    writer = api(world.alice)
    first = writer.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == 201
    reader = api(world.alice, scopes=["tenants:read"])
    replay = reader.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert replay.status_code == 403
    assert "Idempotent-Replayed" not in replay
    assert "secret" not in replay.json()


def test_a_replay_is_refused_once_the_credential_lost_the_permission(world, api):
    client = api(world.alice)
    body = {"name": "helper", "role": "developer", "tenant": "acme"}
    first = client.post("/api/v1/service-accounts/", body, format="json", HTTP_IDEMPOTENCY_KEY="sa")
    assert first.status_code == 201
    Membership.objects.filter(user=world.alice).update(role=TenantRole.VIEWER)
    replay = client.post("/api/v1/service-accounts/", body, format="json", HTTP_IDEMPOTENCY_KEY="sa")
    assert replay.status_code in (403, 404)
    assert "Idempotent-Replayed" not in replay


def test_keys_are_scoped_to_the_endpoint(world, api):
    client = api(world.admin)
    tenant = {"slug": "initech", "name": "Initech", "residency": ["EU"]}
    created = client.post("/api/v1/tenants/", tenant, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert created.status_code == 201
    token = client.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert token.status_code == 201 and token.json()["secret"]
    assert IdempotencyRecord.objects.count() == 2


def test_keys_are_scoped_to_the_token_not_only_the_user(world, api):
    one, two = api(secret=mint(world.alice)), api(secret=mint(world.alice))
    a = one.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="k")
    b = two.post("/api/v1/tokens/", NEW_TOKEN, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]
    assert "Idempotent-Replayed" not in b


def test_an_idempotency_record_holds_no_crackable_fingerprint_of_a_password(world, api):
    """The fingerprint of a request is keyed (HMAC with SECRET_KEY): an idempotency row holds neither a
    password nor an unkeyed hash of the body that a database reader could brute-force offline."""
    import hashlib

    client = api(world.alice)
    body = {"username": "newbie", "password": "correct-horse-9", "email": "n@example.com", "tenant": "acme"}
    created = client.post(
        "/api/v1/users/", {**body, "role": "viewer"}, format="json", HTTP_IDEMPOTENCY_KEY="u"
    )
    assert created.status_code == 201, created.content
    rows = _rows()
    assert "correct-horse-9" not in rows
    record = IdempotencyRecord.objects.get()
    for payload in ({**body, "role": "viewer"},):
        plain = json.dumps(payload, sort_keys=True, default=str)
        unkeyed = hashlib.sha256(f"POST /api/v1/users/\n{plain}".encode()).hexdigest()
        assert record.request_hash != unkeyed
    # still a fingerprint: the same body replays, another body is refused
    again = client.post("/api/v1/users/", {**body, "role": "viewer"}, format="json", HTTP_IDEMPOTENCY_KEY="u")
    assert again["Idempotent-Replayed"] == "true"
    other = client.post(
        "/api/v1/users/",
        {**body, "password": "other-pass-77", "role": "viewer"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="u",
    )
    assert other.status_code == 422
