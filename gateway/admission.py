"""Which requests a saturated model still takes: priorities, load shedding and fairness between tenants.

A model is saturated when every endpoint its next request would go to (the first tier left) is full: the
route table says so from vLLM's own gauges (requests waiting in the engine's queue, KV cache nearly used
up), or this gateway process already has ``max_in_flight`` requests at it. Then:

- **batch** requests are refused at once (503 ``overloaded`` with ``Retry-After``), so the engines' queues
  hold interactive work only and interactive latency stays what it was;
- on a shared deployment (one engine pool serving every tenant), a tenant that already has more than its
  fair share of this gateway's requests in flight there (in flight ÷ tenants with requests there, rounded
  up) is refused too, whatever its class, so one tenant's flood cannot starve the others;
- everything else goes on and waits in the engine's queue as before.

A request's class comes from its token (``priority``, set when the token is minted); the client may ask
for a lower one with ``x-priority: batch``, never a higher one.
"""

import math
from dataclasses import dataclass, field

from gateway import contract
from gateway.inbound import Refused

RANK = {name: rank for rank, name in enumerate(contract.PRIORITIES)}  # 0 is the highest


def request_priority(headers: dict[str, str], granted: str | None) -> str:
    """The request's class: the token's, or the lower one the client asked for."""
    own = granted if granted in RANK else contract.INTERACTIVE
    asked = headers.get("x-priority")
    if asked is None:
        return own
    if asked not in RANK:
        raise Refused(400, f"x-priority must be one of {', '.join(contract.PRIORITIES)}.", "invalid_priority")
    return max(own, asked, key=RANK.__getitem__)


@dataclass
class Admission:
    max_in_flight: int = 0  # per endpoint in this process; 0: only the table's word counts
    at_endpoint: dict[str, int] = field(default_factory=dict)
    by_deployment: dict[int, dict[str, int]] = field(default_factory=dict)  # deployment → tenant → in flight
    shed_counts: dict[str, int] = field(default_factory=lambda: {"batch": 0, "fair_share": 0})

    def saturated(self, tier: list[contract.Endpoint]) -> bool:
        return bool(tier) and all(self._full(e) for e in tier)

    def _full(self, endpoint: contract.Endpoint) -> bool:
        if endpoint.get("saturated"):
            return True
        return 0 < self.max_in_flight <= self.at_endpoint.get(endpoint["url"], 0)

    def shed(self, tenant: str, priority: str, tier: list[contract.Endpoint]) -> str:
        """'' when the request may go to ``tier``, else why it is refused."""
        if not self.saturated(tier):
            return ""
        if priority != contract.INTERACTIVE:
            self.shed_counts["batch"] += 1
            return f"{priority} requests are shed while the model is saturated"
        if tier[0].get("shared") and self._over_fair_share(tenant, tier[0]["deployment"]):
            self.shed_counts["fair_share"] += 1
            return "this tenant already has its fair share of the saturated model's requests in flight"
        return ""

    def _over_fair_share(self, tenant: str, deployment: int) -> bool:
        tenants = self.by_deployment.get(deployment, {})
        others = [n for name, n in tenants.items() if name != tenant]
        if not others:
            return False  # alone on it: nobody to starve
        fair = math.ceil(sum(tenants.values()) / len(tenants))  # among the tenants with requests there
        return tenants.get(tenant, 0) > fair  # only above it: tenants with equal shares all go on

    def start(self, endpoint: contract.Endpoint, tenant: str) -> None:
        url, deployment = endpoint["url"], endpoint["deployment"]
        self.at_endpoint[url] = self.at_endpoint.get(url, 0) + 1
        tenants = self.by_deployment.setdefault(deployment, {})
        tenants[tenant] = tenants.get(tenant, 0) + 1

    def end(self, endpoint: contract.Endpoint, tenant: str) -> None:
        url, deployment = endpoint["url"], endpoint["deployment"]
        _decrement(self.at_endpoint, url)
        tenants = self.by_deployment.get(deployment, {})
        _decrement(tenants, tenant)
        if not tenants:
            self.by_deployment.pop(deployment, None)

    def stats(self) -> dict[str, int]:
        return {f"shed_{reason}": count for reason, count in self.shed_counts.items()}


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
