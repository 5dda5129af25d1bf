"""Webhooks a tenant may set reach public addresses only; a broken receiver never raises."""

from core.webhooks import post_json, public_host


def test_private_loopback_and_link_local_hosts_are_refused():
    for url in (
        "http://127.0.0.1:9/x",
        "http://localhost/x",
        "http://10.0.0.1/x",
        "http://169.254.169.254/x",
        "http://[2002:7f00:1::]/x",  # 6to4 carrying 127.0.0.1: the gateway's rule, so refused here too
        "http://224.0.0.1/x",  # multicast
    ):
        assert not public_host(url), url
        assert post_json(url, {"a": 1}, timeout=0.5, public_only=True) is False
    assert not public_host("http://no-such-host.invalid/x")


def test_a_receiver_that_is_not_there_is_a_false_not_an_exception():
    assert post_json("http://127.0.0.1:9/x", {"a": 1}, timeout=0.5) is False
