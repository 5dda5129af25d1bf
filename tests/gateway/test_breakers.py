"""Circuit breakers per endpoint (closed, open for longer each time in a row, half-open, closed again by a
success) and the retry budget, on a clock moved by hand."""

from gateway.breakers import CLOSED, HALF_OPEN, OPEN, Breakers, RetryBudget
from tests.support.gateway_harness import GatewayWorld, endpoint


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_circuit_opens_longer_each_time_in_a_row_and_closes_on_a_success():
    clock = Clock()
    breakers = Breakers(30, max_seconds=75, clock=clock)
    assert breakers.state("http://a") == CLOSED and not breakers.ejected("http://a")
    assert breakers.failure("http://a") == 30
    assert breakers.state("http://a") == OPEN and breakers.ejected("http://a")
    clock.now += 30
    assert breakers.state("http://a") == HALF_OPEN and not breakers.ejected("http://a")
    assert breakers.failure("http://a") == 60  # failed again on its first trial: longer
    clock.now += 59
    assert breakers.ejected("http://a")
    clock.now += 1
    assert breakers.failure("http://a") == 75  # capped
    clock.now += 75
    breakers.success("http://a")
    assert breakers.state("http://a") == CLOSED
    assert breakers.failure("http://a") == 30  # the count starts over after a success
    assert breakers.stats() == {"open": 1, "half_open": 0, "opened": 4}


def test_retries_in_flight_stay_within_a_share_of_requests_in_flight_with_a_floor():
    budget = RetryBudget(ratio=0.2, floor=3)
    budget.requests = 10
    budget.retries = 2
    assert budget.allows_retry()  # 2 < max(3, 2)
    budget.retries = 3
    assert not budget.allows_retry()
    budget.requests = 100
    assert budget.allows_retry()  # 3 < 20
    budget.retries = 20
    assert not budget.allows_retry() and budget.stats()["refused"] == 2


def test_with_the_budget_spent_a_failed_attempt_is_not_retried(tmp_path):
    gw = GatewayWorld(tmp_path, retry_budget_floor=0, retry_budget_ratio=0.0)
    try:
        (healthy,) = gw.engines(1)
        gw.engine.fail_status = 503
        gw.serve(
            {
                "endpoints": [endpoint(gw.engine.url), {**endpoint(healthy.url), "priority": 1}],
                "preferred": "",
            }
        )
        answer = gw.chat()
        assert answer.status == 502 and "retry budget" in answer.json()["error"]["message"]
        assert not healthy.seen
        gw.gateway.retries.floor = 3
        assert gw.chat().status == 200 and len(healthy.seen) == 1  # the open circuit skips the failing one
    finally:
        gw.close()
