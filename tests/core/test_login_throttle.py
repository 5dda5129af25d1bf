"""The console's sign-in locks a username out from one address after repeated failures, for a cool-off."""

from datetime import timedelta

from django.conf import settings
from django.test import Client

from tests.support.factories import PASSWORD

A, B = "203.0.113.7", "198.51.100.9"


def _login(username: str, password: str, ip: str) -> tuple[Client, int, str]:
    client = Client(REMOTE_ADDR=ip)
    reply = client.post("/login/", {"username": username, "password": password})
    return client, reply.status_code, reply.content.decode()


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_twenty_wrong_passwords_then_the_right_one_does_not_sign_in(world):
    for _ in range(20):
        _login("alice", "wrong-password", A)
    client, status, page = _login("alice", PASSWORD, A)
    assert not _signed_in(client)
    assert status == 429
    assert "Too many failed sign-in attempts" in page


def test_the_lockout_is_per_user_and_address(world):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login("alice", "wrong-password", A)
    assert not _signed_in(_login("alice", PASSWORD, A)[0])
    assert _signed_in(_login("dave", PASSWORD, A)[0])  # another user from the same address
    assert _signed_in(_login("alice", PASSWORD, B)[0])  # the same user from another address


def test_the_lockout_ends_after_the_cool_off(world):
    from axes.models import AccessAttempt

    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login("alice", "wrong-password", A)
    assert not _signed_in(_login("alice", PASSWORD, A)[0])
    # the clock is the attempts' own timestamps: move them back past the cool-off
    attempt = AccessAttempt.objects.get()
    past = attempt.attempt_time - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    AccessAttempt.objects.update(attempt_time=past)
    assert _signed_in(_login("alice", PASSWORD, A)[0])


def test_fewer_failures_than_the_limit_still_sign_in(world):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _, status, page = _login("alice", "wrong-password", A)
    assert status == 200 and "Wrong username or password" in page
    assert _signed_in(_login("alice", PASSWORD, A)[0])
