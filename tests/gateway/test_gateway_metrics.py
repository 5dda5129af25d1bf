"""The gateway's /metrics: what it served (requests by status, latency and TTFT histograms, tokens) by
tenant, model, region and version, and what it refused; the whole page is valid Prometheus text."""

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import may_scrape
from tests.support.gateway_harness import GatewayWorld


def samples(gw: GatewayWorld) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    page = gw.call("GET", "/metrics", tenant=None)
    assert page.status == 200
    families = list(text_string_to_metric_families(page.body.decode()))  # raises on invalid text
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def test_served_requests_are_counted_timed_and_their_tokens_added_by_tenant_and_version(gw):
    assert gw.chat().status == 200
    assert gw.chat(stream=True).status == 200
    assert gw.chat(tenant="globex", model="shared").status == 200
    seen = samples(gw)
    acme = {"tenant": "acme", "model": "chat", "region": "eu-west-1", "version": "m@1"}
    labels = frozenset({**acme, "priority": "interactive", "track": "stable", "code": "200"}.items())
    assert seen[("gateway_requests_total", labels)] == 2
    assert seen[("gateway_request_duration_seconds_count", frozenset(acme.items()))] == 2
    assert seen[("gateway_time_to_first_token_seconds_count", frozenset(acme.items()))] == 2
    assert seen[("gateway_tokens_total", frozenset({**acme, "kind": "completion"}.items()))] == 4
    globex = [k for k in seen if k[0] == "gateway_requests_total" and ("tenant", "globex") in k[1]]
    assert len(globex) == 1 and seen[globex[0]] == 1


def test_refusals_are_counted_by_reason_and_never_reach_an_engine(gw):
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = {"requests_per_minute": 1}
    assert gw.chat().status == 200
    assert gw.chat().status == 429
    gw.gateway.routes.body["tenants"]["acme"]["blocked"] = "monthly budget spent"
    assert gw.chat().status == 429
    seen = samples(gw)
    assert (
        seen[
            ("gateway_refused_requests_total", frozenset({"tenant": "acme", "reason": "rate_limit"}.items()))
        ]
        == 1
    )
    assert (
        seen[("gateway_refused_requests_total", frozenset({"tenant": "acme", "reason": "budget"}.items()))]
        == 1
    )
    assert len(gw.engine.seen) == 1
    assert seen[("gateway_limits_local_decisions_total", frozenset())] == 2  # no Redis here: per process


def test_a_client_cannot_add_labels(gw):
    """Model names a tenant does not have are 404 before anything is counted with their name."""
    for n in range(20):
        assert gw.chat(model=f"made-up-{n}").status == 404
    assert not [k for k in samples(gw) if any(v.startswith("made-up") for _, v in k[1])]


def test_metrics_name_tenants_so_only_this_host_or_a_scraper_with_the_token_reads_them(tmp_path):
    world = GatewayWorld(tmp_path)
    try:
        scope = {"client": ("10.1.2.3", 40000)}
        assert not may_scrape("", scope, {})  # another host, no token configured
        assert may_scrape("", {"client": ("::1", 1)}, {})
        world.gateway.settings.metrics_token = token = "scrape-secret"
        assert may_scrape(token, scope, {"authorization": "Bearer scrape-secret"})
        assert not may_scrape(token, scope, {"authorization": "Bearer wrong"})
        assert not may_scrape(token, {"client": ("127.0.0.1", 1)}, {})  # a token, once set, is needed
        assert world.call("GET", "/metrics", tenant=None).status == 403
    finally:
        world.close()
