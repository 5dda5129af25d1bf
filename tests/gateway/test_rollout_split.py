"""During a rollout the gateway splits a region's requests between the stable revision and the candidate
(sticky per session, monotone in the weight), lets a client preview either with ``x-rollout-track``, and
copies a share of the stable revision's requests to the candidate of the same region in the background,
where a slow or failing copy can neither slow nor fail the client."""

import random
import threading
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import contract
from gateway.balancer import bucket, mirror_target, split_track
from tests.support.gateway_harness import GatewayWorld, rollout_endpoint, rollout_route

CANDIDATE, STABLE = contract.CANDIDATE, contract.STABLE
HOME = "eu-west-1"


@pytest.fixture
def gw(tmp_path):  # type: ignore[no-untyped-def]
    world = GatewayWorld(tmp_path)
    yield world
    world.close()


def rolling(gw: GatewayWorld, candidate: int = 0, mirror: int = 0, candidates: int = 1):  # type: ignore[no-untyped-def]
    """acme's chat in the home region: the world's engine as stable, new engines as the candidate."""
    shadow = gw.engines(candidates)
    endpoints = [rollout_endpoint(gw.engine.url)] + [rollout_endpoint(e.url, track=CANDIDATE) for e in shadow]
    gw.serve(rollout_route(endpoints, {HOME: {"candidate": candidate, "mirror": mirror}}))
    return shadow[0] if candidates == 1 else shadow


def track(answer) -> str:  # type: ignore[no-untyped-def]
    assert answer.status == 200, answer.body
    return CANDIDATE if answer.headers["x-model-version"] == "m@2" else STABLE


def by_track(records: list[dict]) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    found: dict[str, list[dict]] = {STABLE: [], CANDIDATE: [], contract.MIRROR: []}  # type: ignore[type-arg]
    for record in records:
        found[record["track"]].append(record)
    return found


def metric(gw: GatewayWorld, name: str) -> float:
    text = gw.call("GET", "/metrics", tenant=None).body.decode()
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


# --- the split ----------------------------------------------------------------------------------------------
def test_a_session_stays_on_one_revision_for_200_requests(gw):
    rolling(gw, candidate=50)
    assert len({track(gw.chat(headers={"x-session-id": "conversation-7"})) for _ in range(200)}) == 1
    sessions = {f"s{n}": track(gw.chat(headers={"x-session-id": f"s{n}"})) for n in range(40)}
    assert set(sessions.values()) == {STABLE, CANDIDATE}  # sessions do spread


def test_the_body_user_is_the_session_when_there_is_no_header(gw):
    rolling(gw, candidate=50)
    tier = gw.gateway.routes.view("acme")["models"]["chat"]["endpoints"]
    for n in range(30):
        expected = split_track(tier, {HOME: {"candidate": 50, "mirror": 0}}, f"user-{n}", None)
        assert track(gw.chat(user=f"user-{n}")) == expected


def test_raising_the_weight_moves_sessions_only_from_stable_to_candidate(gw):
    rolling(gw, candidate=10)
    sessions = [f"session-{n}" for n in range(150)]
    before = {s: track(gw.chat(headers={"x-session-id": s})) for s in sessions}
    rolling(gw, candidate=50)  # the next generation raises the weight (a new candidate URL, same hash)
    after = {s: track(gw.chat(headers={"x-session-id": s})) for s in sessions}
    assert not [s for s in sessions if before[s] == CANDIDATE and after[s] == STABLE]
    assert sum(v == CANDIDATE for v in after.values()) > sum(v == CANDIDATE for v in before.values())


def test_the_weight_is_monotone_for_every_session_and_every_weight():
    tier = [rollout_endpoint("http://s"), rollout_endpoint("http://c", track=CANDIDATE, deployment=3)]
    keys = [f"k{n}" for n in range(3000)]
    previous: set[str] = set()
    for weight in (0, 1, 5, 10, 25, 50, 75, 99, 100):
        split = {HOME: {"candidate": weight, "mirror": 0}}
        moved = {k for k in keys if split_track(tier, split, k, None) == CANDIDATE}  # type: ignore[arg-type]
        assert previous <= moved
        previous = moved
    assert previous == set(keys)


def test_the_candidates_share_is_its_weight():
    tier = [rollout_endpoint("http://s"), rollout_endpoint("http://c", track=CANDIDATE)]
    split = {HOME: {"candidate": 25, "mirror": 0}}
    ids = [uuid.UUID(int=n).hex for n in range(20_000)]  # fixed ids: the same count on every run
    share = sum(split_track(tier, split, i, None) == CANDIDATE for i in ids) / len(ids)  # type: ignore[arg-type]
    assert 0.24 < share < 0.26


def test_without_a_session_each_request_is_split_by_the_gateways_own_id(gw):
    rolling(gw, candidate=25)
    tracks = []
    for _ in range(120):
        answer = gw.chat()
        # Exactly the request id's bucket decides, so this holds on every run whatever ids were minted.
        share = bucket(1, HOME, answer.headers["x-request-id"])
        assert track(answer) == (CANDIDATE if share < 2500 else STABLE)
        tracks.append(track(answer))
    assert gw.ship() == 120
    records = by_track(gw.control.records)
    assert len(records[CANDIDATE]) == tracks.count(CANDIDATE)
    assert {r["version"] for r in records[CANDIDATE]} == {"m@2"} and not records[contract.MIRROR]


def test_a_candidate_in_a_farther_region_gets_nothing_while_the_home_region_serves(gw):
    (far,) = gw.engines(1)
    endpoints = [
        rollout_endpoint(gw.engine.url),
        rollout_endpoint(far.url, region="eu-central-1", track=CANDIDATE, priority=1),
    ]
    gw.serve(rollout_route(endpoints, {"eu-central-1": {"candidate": 100, "mirror": 100}}))
    assert {track(gw.chat()) for _ in range(20)} == {STABLE}
    gw.settle()
    assert far.seen == []


def test_endpoints_without_a_track_are_stable(gw):
    (other,) = gw.engines(1)
    old = [rollout_endpoint(gw.engine.url), rollout_endpoint(other.url)]
    for endpoint in old:
        del endpoint["track"]  # an older control plane
    gw.serve(rollout_route(old, {HOME: {"candidate": 100, "mirror": 100}}))
    assert all(gw.chat().status == 200 for _ in range(20))
    gw.settle()
    assert gw.ship() == 20 and {r["track"] for r in gw.control.records} == {STABLE}


# --- a failing candidate ------------------------------------------------------------------------------------
def test_a_candidate_answering_5xx_never_fails_a_client(gw):
    failing = rolling(gw, candidate=100, candidates=3)
    for engine in failing:
        engine.fail_status = 503
    answers = [gw.chat(headers={"x-session-id": f"s{n}"}) for n in range(10)]
    assert [a.status for a in answers] == [200] * 10
    assert {track(a) for a in answers} == {STABLE}
    # A request tries one candidate at most, then the stable revision (not the other candidates); each
    # candidate that failed is ejected, so once all three are, requests go straight to the stable one.
    assert [len(e.seen) for e in failing] == [1, 1, 1]
    assert metric(gw, "gateway_rollout_candidate_failures_total") == 3
    assert gw.ship() == 10
    assert {r["track"] for r in gw.control.records} == {STABLE}
    assert [r["attempts"] for r in gw.control.records] == [2, 2, 2] + [1] * 7
    # The client never saw those failures; the rollout's analysis must, so each record carries its own.
    assert [r.get("candidate_errors", 0) for r in gw.control.records] == [1, 1, 1] + [0] * 7


def test_a_preview_of_a_dead_candidate_is_answered_by_the_stable_revision(gw):
    dead = rolling(gw)
    dead.server.shutdown()
    dead.server.server_close()  # connection refused
    answer = gw.chat(headers={"x-rollout-track": "candidate"})
    assert track(answer) == STABLE


# --- preview ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["candidate", "CANDIDATE", " Candidate "])
def test_the_preview_header_reaches_a_candidate_that_has_no_weight(gw, value):
    rolling(gw, candidate=0)
    assert {track(gw.chat(headers={"x-rollout-track": value})) for _ in range(10)} == {CANDIDATE}
    assert {track(gw.chat()) for _ in range(10)} == {STABLE}


def test_the_preview_header_keeps_a_client_on_the_stable_revision_at_full_weight(gw):
    rolling(gw, candidate=100)
    assert {track(gw.chat(headers={"x-rollout-track": "Stable"})) for _ in range(10)} == {STABLE}
    assert {track(gw.chat()) for _ in range(10)} == {CANDIDATE}


def test_the_preview_header_is_ignored_where_no_rollout_runs(gw):
    assert gw.chat(headers={"x-rollout-track": "candidate"}).status == 200


@pytest.mark.parametrize("value", ["canary", "stable,candidate", "x" * 5000, "candidate\x00"])
def test_an_unknown_preview_track_is_400_with_the_error_envelope(gw, value):
    rolling(gw, candidate=50)
    answer = gw.chat(headers={"x-rollout-track": value})
    assert answer.status == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_rollout_track" and error["request_id"] == answer.headers["x-request-id"]
    assert value.strip() not in error["message"]  # an untrusted value is not reflected
    assert gw.ship() == 0  # refused before any engine: no record


# --- usage records ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_every_record_names_its_track_and_time_to_first_byte(gw, stream):
    rolling(gw, candidate=50)
    for n in range(20):
        assert gw.chat(stream=stream, headers={"x-session-id": f"s{n}"}).status == 200
    assert gw.ship() == 20
    records = by_track(gw.control.records)
    assert records[STABLE] and records[CANDIDATE]
    for record in gw.control.records:
        assert 0 < record["ttft_ms"] <= record["latency_ms"]
        assert record["version"] == ("m@2" if record["track"] == CANDIDATE else "m@1")


def test_a_request_no_engine_answered_has_no_time_to_first_byte(gw):
    gw.engine.server.shutdown()
    gw.engine.server.server_close()
    assert gw.chat().status == 502
    assert gw.ship() == 1
    (record,) = gw.control.records
    assert "ttft_ms" not in record and record["track"] == STABLE


# --- the mirror ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_a_mirrored_client_gets_the_stable_answer_and_the_copy_is_recorded_once(gw, stream):
    baseline = gw.chat(stream=stream)
    shadow = rolling(gw, mirror=100)
    answer = gw.chat(stream=stream)
    assert (answer.status, answer.body) == (baseline.status, baseline.body)
    drop = {"x-request-id"}
    assert {k: v for k, v in answer.headers.items() if k not in drop} == {
        k: v for k, v in baseline.headers.items() if k not in drop
    }
    gw.settle()
    assert len(shadow.seen) == 1 and shadow.seen[0]["body"]["model"] == "m"
    assert gw.ship() == 3
    records = by_track(gw.control.records)
    (mirror,) = records[contract.MIRROR]
    client = records[STABLE][-1]
    assert client["request_id"] == answer.headers["x-request-id"]
    assert mirror["request_id"] != client["request_id"] and len(mirror["request_id"]) == 32
    assert shadow.seen[0]["headers"]["X-Request-Id"] == mirror["request_id"]
    assert (mirror["region"], mirror["deployment"], mirror["version"]) == (HOME, 1, "m@2")
    assert mirror["endpoint"] == shadow.url and mirror["status"] == 200 and mirror["stream"] is stream
    assert (mirror["prompt_tokens"], mirror["completion_tokens"]) == (5, 2)
    assert 0 < mirror["ttft_ms"] <= mirror["latency_ms"] and mirror["client_request_id"] == ""
    assert metric(gw, "gateway_mirrors_sent_total") == 1


def test_a_mirror_copies_the_share_its_split_names_by_request_id(gw):
    shadow = rolling(gw, mirror=30)
    ids = [gw.chat().headers["x-request-id"] for _ in range(60)]
    gw.settle()
    expected = [i for i in ids if bucket("mirror", 1, HOME, i) < 3000]
    assert len(shadow.seen) == len(expected) == metric(gw, "gateway_mirrors_sent_total")


def test_a_slow_mirror_does_not_slow_the_client(gw):
    shadow = rolling(gw, mirror=100)
    shadow.delay = 5.0
    for stream in (False, True):
        began = time.perf_counter()
        answer = gw.chat(stream=stream)
        assert answer.status == 200 and time.perf_counter() - began < 1.0
    assert gw.gateway.mirrors.stats()["in_flight"] == 2


def test_a_mirror_past_its_timeout_is_recorded_as_failed(tmp_path):
    gw = GatewayWorld(tmp_path, mirror_timeout_seconds=0.3)
    try:
        shadow = rolling(gw, mirror=100)
        shadow.delay = 3.0
        assert gw.chat().status == 200
        gw.settle()
        assert gw.ship() == 2
        (mirror,) = by_track(gw.control.records)[contract.MIRROR]
        assert mirror["status"] == 504 and "ttft_ms" not in mirror
        assert metric(gw, "gateway_mirrors_failed_total") == 1
    finally:
        gw.close()


def test_a_failing_mirror_is_counted_and_never_reaches_the_client(gw):
    shadow = rolling(gw, mirror=100)
    shadow.fail_status = 500
    assert [gw.chat().status for _ in range(3)] == [200] * 3
    gw.settle()
    assert metric(gw, "gateway_mirrors_failed_total") == 3
    assert gw.ship() == 6
    assert [r["status"] for r in by_track(gw.control.records)[contract.MIRROR]] == [500] * 3


def test_when_the_mirrors_are_full_a_copy_is_dropped_and_counted(tmp_path):
    gw = GatewayWorld(tmp_path, max_mirrors_in_flight=1)
    try:
        shadow = rolling(gw, mirror=100)
        shadow.hold = threading.Event()
        assert [gw.chat().status for _ in range(3)] == [200] * 3
        assert (metric(gw, "gateway_mirrors_sent_total"), metric(gw, "gateway_mirrors_dropped_total")) == (
            1,
            2,
        )
        assert metric(gw, "gateway_mirrors_in_flight") == 1
        shadow.hold.set()
        gw.settle()
        assert gw.ship() == 4 and len(by_track(gw.control.records)[contract.MIRROR]) == 1
    finally:
        gw.close()


def test_mirror_copies_are_not_counted_against_the_tenants_limits(gw):
    limits = {"tokens_per_minute": 100_000, "requests_per_minute": 3}
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = limits
    rolling(gw, mirror=100)
    gw.engine.usage = {"prompt_tokens": 10_000, "completion_tokens": 0}
    assert [gw.chat().status for _ in range(3)] == [200] * 3
    gw.settle()
    assert metric(gw, "gateway_mirrors_sent_total") == 3
    # The client's 30,000 tokens were spent (plus a second or so of refill); the copies' would make 60,000.
    assert 65_000 < gw.gateway.limits.local.buckets[("acme", "tokens")].level < 80_000
    assert gw.chat().status == 429  # the fourth request: three were admitted, no copy took a request's place


def test_a_mirror_never_goes_to_a_candidate_in_another_region(gw):
    near, far = gw.engines(2)
    endpoints = [
        rollout_endpoint(gw.engine.url),
        rollout_endpoint(near.url, track=CANDIDATE, deployment=2),  # another deployment's candidate
        rollout_endpoint(far.url, region="eu-central-1", track=CANDIDATE, priority=1),
    ]
    splits = {HOME: {"candidate": 0, "mirror": 100}, "eu-central-1": {"candidate": 0, "mirror": 100}}
    gw.serve(rollout_route(endpoints, splits))
    assert [gw.chat().status for _ in range(10)] == [200] * 10
    gw.settle()
    assert far.seen == [] and near.seen == [] and metric(gw, "gateway_mirrors_sent_total") == 0


def test_a_request_the_candidate_served_is_not_mirrored(gw):
    shadow = rolling(gw, candidate=100, mirror=100)
    assert {track(gw.chat()) for _ in range(5)} == {CANDIDATE}
    gw.settle()
    assert len(shadow.seen) == 5 and metric(gw, "gateway_mirrors_sent_total") == 0


# --- the mirror stays in its region, whatever the table -----------------------------------------------------
REGIONS = ["eu-west-1", "eu-central-1", "us-east-1"]
endpoints_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "region": st.sampled_from(REGIONS),
            "track": st.sampled_from([STABLE, CANDIDATE, None]),
            "deployment": st.integers(1, 2),
        }
    ),
    min_size=1,
    max_size=8,
)
splits_strategy = st.dictionaries(
    st.sampled_from(REGIONS),
    st.fixed_dictionaries({"candidate": st.integers(0, 100), "mirror": st.integers(0, 100)}),
)


def random_route(shapes: list[dict], splits: dict) -> dict:  # type: ignore[type-arg]
    endpoints = []
    for n, shape in enumerate(shapes):
        endpoint = rollout_endpoint(f"http://e{n}", shape["region"], shape["track"] or STABLE)
        endpoint["deployment"], endpoint["priority"] = shape["deployment"], REGIONS.index(shape["region"])
        if shape["track"] is None:
            del endpoint["track"]  # an older control plane's endpoint
        endpoints.append(endpoint)
    return rollout_route(endpoints, splits)


@settings(max_examples=300, deadline=None)
@given(endpoints_strategy, splits_strategy, st.data())
def test_a_mirror_only_ever_targets_a_candidate_of_the_served_region(shapes, splits, data):
    route = random_route(shapes, splits)
    served = data.draw(st.sampled_from(route["endpoints"]))
    target = mirror_target(route, served, data.draw(st.text(max_size=40)))  # type: ignore[arg-type]
    if target is None:
        return
    assert target in route["endpoints"] and target.get("track") == CANDIDATE
    assert (target["region"], target["deployment"]) == (served["region"], served["deployment"])
    assert served.get("track", STABLE) == STABLE


def test_through_the_gateway_every_copy_stays_in_the_region_that_served(gw):
    """The same property end to end, over random tables of real (fake) engines: seeded, so reproducible."""
    urls = sorted(e.url for e in [gw.engine, *gw.engines(6)])
    rng, copies = random.Random(13), 0
    for _ in range(40):
        endpoints = []
        for url in rng.sample(urls, rng.randint(2, 7)):
            region = rng.choice(REGIONS)
            endpoint = rollout_endpoint(url, region, rng.choice([STABLE, CANDIDATE]), REGIONS.index(region))
            endpoints.append(endpoint | {"deployment": rng.randint(1, 2)})
        splits = {r: {"candidate": rng.choice([0, 50]), "mirror": 100} for r in rng.sample(REGIONS, 2)}
        gw.serve(rollout_route(endpoints, splits))
        for _ in range(3):
            gw.chat(headers={"x-session-id": str(rng.random())})
            gw.settle()
            gw.control.records.clear()
            gw.ship()
            if not gw.control.records:  # only candidates that take no share were left: nobody answered
                continue
            client, *mirrored = gw.control.records  # this request's record, then its copy if any
            for copy in mirrored:
                assert copy["track"] == contract.MIRROR and client["track"] == STABLE
                (target,) = [e for e in endpoints if e["url"] == copy["endpoint"]]
                assert target["track"] == CANDIDATE
                assert (target["region"], target["deployment"]) == (client["region"], client["deployment"])
                copies += 1
    assert copies > 10  # the tables did exercise the mirror


def test_a_shadow_candidate_never_answers_a_client_even_when_stable_is_gone(gw):
    """With the stable engine refusing connections and the candidate only mirrored to, the client gets an
    error, never the unvetted candidate's answer (and is never billed for it)."""
    candidate = rolling(gw, candidate=0, mirror=100)
    gw.engine.server.shutdown()
    gw.engine.server.server_close()
    answers = [gw.chat(headers={"x-session-id": f"s{n}"}) for n in range(5)]
    assert all(a.status >= 500 for a in answers)
    assert candidate.seen == []
