"""Membership is not the permission to read a tenant's details: a robot token without ``tenants:read``
still names its own tenant as an owner, and sees it in /me/. One function answers "which tenants may this
caller see", and every app's selectors use it."""

import io

import pytest
from django.core.management import call_command

from core import selectors
from core.choices import ALL_SCOPES, Scope
from core.models import ServiceAccount
from core.services.tokens import token_create
from tests.support.principals import principal, system


def _docs_robot_token() -> str:
    """Exactly as docs/access-control.md mints the CI robot's token."""
    out = io.StringIO()
    call_command(
        "create_token",
        "--service-account",
        "acme/ci",
        "--role",
        "developer",
        "--scopes",
        "registry:read,registry:write,registry:promote",
        "--expires-in-days",
        "90",
        stdout=out,
    )
    return out.getvalue().strip()


def test_the_documented_robot_token_registers_a_model_of_its_own_tenant(world, api):
    client = api(secret=_docs_robot_token())
    created = client.post("/api/v1/models/", {"owner": "acme", "name": "llama-3-8b"}, format="json")
    assert created.status_code == 201, created.json()
    me = client.get("/api/v1/me/").json()
    assert me["tenants"] == {"acme": "developer"}


def test_the_robot_token_still_cannot_read_tenant_details_or_reach_another_tenant(world, api):
    client = api(secret=_docs_robot_token())
    assert client.get("/api/v1/tenants/acme/").status_code == 403
    other = client.post("/api/v1/models/", {"owner": "globex", "name": "llama-3-8b"}, format="json")
    assert other.status_code == 404
    assert "globex" in other.json()["error"]["message"]


def test_a_user_token_without_tenants_read_sees_its_memberships_in_me(world, api):
    me = api(world.dave, scopes=["registry:read"]).get("/api/v1/me/").json()
    assert me["tenants"] == {"acme": "developer"}


@pytest.mark.parametrize("scope", sorted(ALL_SCOPES))
def test_one_answer_to_which_tenants_a_caller_sees(world, scope):
    """tenants_for, per scope, is exactly the rows visible_tenant_ids names, for every kind of caller."""
    robot = ServiceAccount.objects.get(tenant=world.tenant_a, name="ci")
    token, _ = token_create(actor=system(), name="r", scopes=["registry:read"], service_account=robot)
    from core.api.authentication import principal_for_token

    callers = [principal(u) for u in (world.alice, world.dave, world.vera, world.bob, world.admin)]
    callers += [principal(world.operator), principal(world.auditor), principal_for_token(token, "api")]
    for caller in callers:
        ids = selectors.visible_tenant_ids(caller, scope)
        listed = set(selectors.tenants_for(caller, scope).values_list("pk", flat=True))
        if ids is None:
            assert listed == {world.tenant_a.pk, world.tenant_b.pk}
        else:
            assert listed == ids
            assert ids <= set(caller.tenant_roles)


def test_an_operator_sees_the_tenant_robot_tokens_it_may_revoke(world, api):
    token_create(
        actor=principal(world.bob), name="b", scopes=["registry:read"], service_account=world.robot_b
    )
    listed = {t["name"] for t in api(world.operator).get("/api/v1/tokens/").json()["results"]}
    assert "b" in listed
    assert Scope.TOKENS_WRITE in principal(world.operator).platform_scopes


def test_the_access_control_docs_automation_example_works_as_written(db, api, monkeypatch):
    """Run docs/access-control.md's commands literally, then use the robot's token as the docs say."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "access-control.md").read_text()
    block = text.split("## Automation", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("CONTROLPLANE_PASSWORD", "correct-horse-battery-9")
    secret = ""
    for command in block.replace("\\\n", " ").strip().splitlines():
        command = re.sub(r"^\S+=\S+ ", "", command.split("#")[0].strip())
        words = shlex.split(command)
        assert words[:2] == ["python", "manage.py"], command
        out = io.StringIO()
        call_command(*words[2:], stdout=out)
        secret = out.getvalue().strip()
    client = api(secret=secret)
    created = client.post("/api/v1/models/", {"owner": "helvetia", "name": "llama-3-8b"}, format="json")
    assert created.status_code == 201, created.json()
    assert client.get("/api/v1/me/").json()["tenants"] == {"helvetia": "developer"}
