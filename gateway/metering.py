"""What one usage record says: the served endpoint, the outcome and the timings, with token counts taken
defensively from whatever the engine reported. The client's requests and the shadow copies of them
(``gateway/mirror.py``) build their records here, so both carry the same fields."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway import contract


@dataclass
class Outcome:
    """What an upstream exchange came to so far: filled in as soon as each part is known, so a record made
    when the exchange breaks off (engine gone mid-stream, client gone, timeout) has what was seen."""

    endpoint: contract.Endpoint | None = None
    status: int = 502
    usage: Any = field(default_factory=dict)
    ttft_ms: float | None = None  # from sending upstream to the first byte: None when none came
    attempt: int = 0
    candidate_errors: int = 0  # candidate attempts that failed before the first byte (all attempts)
    # The answer's bytes as the client got them, kept for the response cache (None: not kept, or too big).
    kept: list[bytes] | None = None
    kept_bytes: int = 0
    keep_limit: int = 0
    content_type: str = ""

    def restart(self, endpoint: contract.Endpoint, attempt: int) -> None:
        """A new attempt: only its own answer counts."""
        self.endpoint, self.attempt = endpoint, attempt
        self.status, self.usage, self.ttft_ms = 502, {}, None
        if self.kept is not None:
            self.kept, self.kept_bytes = [], 0

    def keep(self, data: bytes) -> None:
        """Keep part of the answer for the cache; past ``keep_limit`` keep none of it."""
        if self.kept is not None:
            self.kept.append(data)
            self.kept_bytes += len(data)
            if self.kept_bytes > self.keep_limit:
                self.kept = None


def usage_tokens(usage: Any, key: str) -> int:
    """A token count from the engine's ``usage``, whatever it sent: a whole number in the control plane's
    range, else 0 (null, a string, a negative or fractional count, ``usage`` not an object)."""
    value = usage.get(key) if isinstance(usage, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0
    if value < 0 or value == float("inf"):
        return 0
    return min(int(value), 2**31 - 1)


def spent_tokens(outcome: Outcome) -> int:
    return usage_tokens(outcome.usage, "prompt_tokens") + usage_tokens(outcome.usage, "completion_tokens")


def usage_record(
    *,
    request_id: str,
    client_request_id: str,
    tenant: str,
    model_name: str,
    outcome: Outcome,
    track: str,
    latency_ms: float,
    stream: bool,
    started_at: datetime,
    served_model_name: str = "",
    degraded: str = "",
    trace_id: str = "",
    pipeline: tuple[str, str] | None = None,
) -> contract.UsageRecord:
    endpoint = outcome.endpoint
    assert endpoint is not None  # only an exchange that reached an endpoint is metered
    record: contract.UsageRecord = {
        "request_id": request_id,
        "client_request_id": client_request_id,
        "tenant": tenant,
        "model_name": model_name,
        "region": endpoint["region"],
        "deployment": endpoint["deployment"],
        "version": endpoint["version"],
        "artifact_sha256": endpoint.get("artifact_sha256", ""),
        "endpoint": endpoint["url"],
        "status": outcome.status,
        "prompt_tokens": usage_tokens(outcome.usage, "prompt_tokens"),
        "completion_tokens": usage_tokens(outcome.usage, "completion_tokens"),
        "latency_ms": round(latency_ms, 2),
        "attempts": outcome.attempt,
        "stream": stream,
        "track": track,
        "started_at": started_at.isoformat(),
    }
    if outcome.candidate_errors:
        record["candidate_errors"] = outcome.candidate_errors
    if degraded:
        record["served_model_name"], record["degraded"] = served_model_name, degraded
    if trace_id:
        record["trace_id"] = trace_id
    if pipeline is not None:
        record["pipeline"], record["stage"] = pipeline
    if outcome.ttft_ms is not None:  # absent, not 0, when no byte came: a 0 would flatter TTFT figures
        record["ttft_ms"] = round(outcome.ttft_ms, 2)
    return record
