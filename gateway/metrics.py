"""What the gateway serves, as Prometheus metrics: requests, latency and time to first token, tokens, by
tenant, model, region and version, and the requests it refused before any engine saw them.

Every forwarded request is observed from its usage record (the one record it makes, however it ends), so
these figures and the bill count the same requests. Labels come from the route table and the gateway's
own decisions, never from a client's header or body, so a client cannot grow the label sets.
"""

import hmac
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway import contract

# Seconds: from a few ms (a cache or a short answer) to the 10-minute upstream timeout.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# vLLM's own TTFT buckets (vllm:time_to_first_token_seconds), so the two histograms line up.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
    20,
    40,
    80,
)
SERVED = ("tenant", "model", "region", "version")


class GatewayMetrics:
    def __init__(self) -> None:
        self._children: dict[tuple[object, ...], tuple[Any, ...]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "gateway_requests",
            "Requests forwarded to an engine, by how they ended (code: the client's status)",
            [*SERVED, "priority", "track", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds",
            "From a request's arrival to its last byte (a held request: from the start of its hold)",
            SERVED,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "From sending a request to an engine to its first byte (a stream's first event)",
            SERVED,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "gateway_tokens", "Tokens the engines reported", [*SERVED, "kind"], registry=self.registry
        )
        self.degraded = Counter(
            "gateway_degraded_requests",
            "Requests sent to a fallback of the model asked for, by why (capacity, budget, unavailable)",
            ["tenant", "model", "reason"],
            registry=self.registry,
        )
        self.refused = Counter(
            "gateway_refused_requests",
            "Requests refused before any engine saw them, by why (rate_limit, budget, shed, unavailable)",
            ["tenant", "reason"],
            registry=self.registry,
        )

        self.stages = Histogram(
            "gateway_pipeline_stage_duration_seconds",
            "A pipeline stage's time, by how it ended (ok; skipped: it failed or overran and passed its "
            "input on; failed); a model stage's tokens are in gateway_tokens under the model it called",
            ["tenant", "pipeline", "stage", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stage_tokens = Counter(
            "gateway_pipeline_stage_tokens",
            "Tokens a pipeline's model stage spent, by the pipeline's version and the stage",
            ["tenant", "pipeline_version", "stage", "kind"],
            registry=self.registry,
        )

    def stage(self, tenant: str, pipeline: str, stage: str, outcome: str, seconds: float) -> None:
        self.stages.labels(tenant, pipeline, stage, outcome).observe(seconds)

    def observe(self, record: contract.UsageRecord, priority: str) -> None:
        served = (record["tenant"], record["model_name"], record["region"], record["version"])
        key = (*served, priority, record["track"], record["status"])
        children = self._children.get(key)
        if children is None:  # labels() takes a lock and builds a tuple: once per label set, not per request
            children = self._children[key] = (
                self.requests.labels(*served, priority, record["track"], str(record["status"])),
                self.latency.labels(*served),
                self.ttft.labels(*served),
                self.tokens.labels(*served, "prompt"),
                self.tokens.labels(*served, "completion"),
            )
        requests, latency, ttft, prompt, completion = children
        requests.inc()
        latency.observe(record["latency_ms"] / 1e3)
        if "ttft_ms" in record:
            ttft.observe(record["ttft_ms"] / 1e3)
        prompt.inc(record["prompt_tokens"])
        completion.inc(record["completion_tokens"])
        if record.get("stage"):  # labels from the route table (a pipeline's stage), never from a client
            staged = (record["tenant"], record["pipeline"], record["stage"])
            self.stage_tokens.labels(*staged, "prompt").inc(record["prompt_tokens"])
            self.stage_tokens.labels(*staged, "completion").inc(record["completion_tokens"])

    def degrade(self, tenant: str, model: str, reason: str) -> None:
        self.degraded.labels(tenant, model, reason).inc()

    def refuse(self, tenant: str, reason: str) -> None:
        self.refused.labels(tenant, reason).inc()

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def exposition(prefix: str, values: dict[str, int], gauges: set[str]) -> str:
    lines = []
    for name, value in values.items():
        kind = "gauge" if name in gauges else "counter"
        metric = prefix + name + ("_total" if kind == "counter" else "")
        lines += [f"# TYPE {metric} {kind}", f"{metric} {value}"]
    return "\n".join(lines) + "\n"


def may_scrape(token: str, scope: dict[str, Any], headers: dict[str, str]) -> bool:
    """The metrics carry every tenant's traffic: with GATEWAY_METRICS_TOKEN (``token``) set, only a scraper
    sending it as a bearer token reads them; without it, only this host (Prometheus beside the gateway)."""
    if token:
        sent = headers.get("authorization", "")
        return hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())
    client = scope.get("client") or ("", 0)
    return client[0] in ("127.0.0.1", "::1")
