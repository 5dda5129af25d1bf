"""How much the gateway trusts each engine, and how many retries it may add.

- **Circuit breakers**, one per endpoint, as Envoy's outlier detection does it. *Closed*: the endpoint
  takes traffic. A failure before the first byte (no connection, a timeout, a 5xx) opens it: this
  gateway process sends it nothing for ``base × times opened in a row`` seconds (30, 60, 90 … at most
  300), since an engine that keeps failing right after it comes back is likely still broken. Then it is
  *half-open*: it takes traffic again, and the first outcome decides. A success closes it (and forgets the
  count); a failure opens it again, for longer.
- **A retry budget**, as Envoy's and Finagle's: retries in flight may be at most a share of the requests
  in flight (20 %), with a floor (3) so a quiet gateway can still retry. When engines are failing under
  load, retries that multiply the load are what turns a brownout into an outage; the budget caps them.

The clock is passed in, so tests move time by hand.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class Circuit:
    opened: int = 0  # times opened in a row, without a success between
    until: float = 0.0  # open until then; half-open after, while ``opened`` > 0


class Breakers:
    def __init__(
        self, base_seconds: float, max_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic
    ):
        self.base, self.max, self.clock = base_seconds, max_seconds, clock
        self.circuits: dict[str, Circuit] = {}
        self.opened_total = 0

    def state(self, url: str) -> str:
        circuit = self.circuits.get(url)
        if circuit is None:
            return CLOSED
        return OPEN if self.clock() < circuit.until else HALF_OPEN

    def ejected(self, url: str) -> bool:
        """Whether the endpoint takes no traffic from this process now (its circuit is open)."""
        circuit = self.circuits.get(url)
        return circuit is not None and self.clock() < circuit.until

    def failure(self, url: str) -> float:
        """Open the circuit; returns for how many seconds."""
        circuit = self.circuits.setdefault(url, Circuit())
        circuit.opened += 1
        seconds = min(self.base * circuit.opened, self.max)
        circuit.until = self.clock() + seconds
        self.opened_total += 1
        return seconds

    def success(self, url: str) -> None:
        if url in self.circuits:  # a dict lookup on the hot path; nothing else for a closed circuit
            del self.circuits[url]

    def stats(self) -> dict[str, int]:
        states = [self.state(url) for url in self.circuits]
        return {"open": states.count(OPEN), "half_open": states.count(HALF_OPEN), "opened": self.opened_total}


class RetryBudget:
    def __init__(self, ratio: float = 0.2, floor: int = 3):
        self.ratio, self.floor = ratio, floor
        self.requests = 0  # in flight
        self.retries = 0  # in flight
        self.refused = 0

    def allows_retry(self) -> bool:
        if self.retries < max(self.floor, self.ratio * self.requests):
            return True
        self.refused += 1
        return False

    def stats(self) -> dict[str, int]:
        return {
            "requests_in_flight": self.requests,
            "retries_in_flight": self.retries,
            "refused": self.refused,
        }


def broken_connection(exc: BaseException) -> bool:
    """The connection broke before an answer (closed by the other side, a failed write), as opposed to no
    connection at all (refused, unreachable), a timeout or a 5xx."""
    return isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError) and not isinstance(
        exc, aiohttp.ClientConnectorError
    )
