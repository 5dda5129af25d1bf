"""The wire between the control plane and its gateways, typed once for both sides.

- The route table: what ``GET /api/v1/routing/gateway-config/`` answers (``GatewayConfig``) and what a
  gateway keeps on disk (its ``table``). The control plane builds it (``routing/routes.py``,
  ``routing/services.py``), the gateway reads it (``gateway/config.py``, ``gateway/app.py``,
  ``gateway/balancer.py``).
- The usage record: what a gateway spools for every request it forwarded (``gateway/usage.py``) and posts
  in batches to ``POST /api/v1/usage/``, where the control plane ingests it (``billing/services.py``).

TypedDicts because the wire is JSON: both sides build and read plain dicts, so typing them changes no
byte on the wire. Django-free, and nothing else in ``gateway/`` may be imported by the control plane.
"""

from typing import NotRequired, TypedDict

# The revisions a route may name in one region: the stable one, and during a rollout its candidate.
STABLE, CANDIDATE = "stable", "candidate"
# What a usage record says served the request: a revision, or a copy sent to the candidate (shadow),
# which the client never saw and no tenant pays for, or the response cache (no engine ran: no GPU cost).
MIRROR = "mirror"
CACHED = "cache"
# A request's class when a model is saturated, highest first: the lower ones are shed first.
INTERACTIVE, BATCH = "interactive", "batch"
PRIORITIES = (INTERACTIVE, BATCH)
# Why a request was served by a fallback (the response's x-degraded, the usage record's ``degraded``).
CAPACITY, BUDGET, UNAVAILABLE = "capacity", "budget", "unavailable"
DEGRADED_REASONS = (CAPACITY, BUDGET, UNAVAILABLE)


class Endpoint(TypedDict):
    """One engine that may serve a route, in the order the gateway should try them."""

    url: str
    region: str
    priority: int  # the tier: a gateway sends to the lowest tier with an endpoint left
    weight: int  # 1..100 within a tier: load headroom
    deployment: int
    version: str  # "model@1.2.0"
    served_model: str  # what the engine answers to (the gateway rewrites "model" to it)
    artifact_sha256: str
    shared: bool  # a platform deployment serving every tenant: its prefix cache is salted per tenant
    jurisdiction: NotRequired[str]  # its region's (where a response it served may be cached)
    # Its engines' API key (sent as Authorization: Bearer); only in what gateways fetch, never stored.
    api_key: NotRequired[str]
    track: NotRequired[str]  # STABLE or CANDIDATE; absent (an older control plane) means STABLE
    # The engine is full: requests wait in its queue or its KV cache is nearly used up (vLLM's gauges, as
    # the router last read them). Absent (an older control plane) means not saturated.
    saturated: NotRequired[bool]


class Split(TypedDict):
    """A rollout's weights in one region: percent of requests sent to the candidate, percent copied to it."""

    candidate: int
    mirror: int


class CachePlace(TypedDict):
    """Where a route's answers may be cached: the store of a jurisdiction the tenant's data may be in (a
    region serving it is there), for one production release (the deployment's version and its weights)."""

    jurisdiction: str
    deployment: int
    version: str
    artifact_sha256: str


class ResponseCache(TypedDict):
    """A route the tenant opted in to the gateways' response cache for (gateway/response_cache.py)."""

    ttl_seconds: int
    places: list[CachePlace]  # in the route's order; empty: no production version is served now


class Activatable(TypedDict):
    """A deployment at zero replicas in one region, which a request may wake (the autoscaler idled it)."""

    deployment: int
    region: str


class Route(TypedDict):
    """One model name of one tenant; no endpoints means it is unavailable, and ``unavailable`` says why.

    ``splits``, by region, exists only while a rollout has a candidate there that may serve this tenant:
    the gateway sends that share of the region's requests (sticky per session) to the candidate's
    endpoints, copies the mirror share to them, and treats the candidate as stable nowhere else.

    ``activatable`` exists only on a route without endpoints, naming the region (inside the tenant's
    residency) where the deployment sits at zero and wakes on a request: the gateway holds the request,
    asks the control plane to activate it (``POST /api/v1/routing/activations/``) and sends it on once a
    later table gives this route endpoints."""

    endpoints: list[Endpoint]
    preferred: str  # the region traffic goes to when everything is healthy ('' when none is compliant)
    unavailable: NotRequired[str]
    splits: NotRequired[dict[str, Split]]
    activatable: NotRequired[Activatable]
    fallbacks: NotRequired[list[str]]  # the tenant's other model names to try, in order (see gateway/app.py)
    cache: NotRequired[ResponseCache]  # present only when the tenant opted in for this model


class TenantLimits(TypedDict, total=False):
    """A tenant's limits (per minute, and requests in flight at once); a limit that is not set is absent."""

    requests_per_minute: int
    tokens_per_minute: int
    concurrent_requests: int


# The model tasks a gateway runs as pipeline stages.
PIPELINE_TASKS = ("chat", "completion", "embed", "rerank", "classify")


class StageWhen(TypedDict):
    """A stage runs only when an earlier stage's label is one of ``labels`` (or none its siblings name)."""

    stage: str
    labels: list[str]
    otherwise: bool


class PipelineStage(TypedDict):
    """One stage of a pipeline as a gateway runs it (the registry checked the graph: docs/pipelines.md).
    ``inputs`` maps each parameter to its source: an earlier stage, ``request.messages`` or
    ``request.query``. The kind's own fields are present for that kind only."""

    name: str
    kind: str  # model, http, retrieve, redact, template
    inputs: dict[str, str]
    output: str  # the type it gives: text, messages, vector, documents, label, json
    timeout_ms: int | None
    on_failure: str  # fail, or skip: pass on its input of its output's type instead
    passes: NotRequired[str]  # skip: the source whose value it passes on
    when: NotRequired[StageWhen]
    route: NotRequired[str]  # model: the tenant's model name it calls, through the gateway's own routing
    task: NotRequired[str]  # model: chat, completion, embed, rerank, classify
    max_tokens: NotRequired[int]  # model
    top_n: NotRequired[int]  # model, rerank: how many of the documents it passes on, best first
    labels: NotRequired[list[str]]  # a stage giving a label (classify, http): every label it may give
    url: NotRequired[str]  # http
    jurisdiction: NotRequired[str]  # http: where the service runs (inside the tenant's residency)
    secret: NotRequired[str]  # http: the name of the calling tenant's secret it sends as a bearer token
    secret_version: NotRequired[str]  # http: that secret's version (a new value publishes a new table)
    secret_value: NotRequired[str]  # http: its value, in the gateways' copy of the table only
    patterns: NotRequired[list[str]]  # redact: regular expressions
    replacement: NotRequired[str]  # redact
    template: NotRequired[str]  # template: a format string over the inputs
    system: NotRequired[str]  # template: a system message ('' for none)
    index: NotRequired[str]  # retrieve: the calling tenant's index
    revision: NotRequired[int]  # retrieve: the index's revision when the table was published
    top_k: NotRequired[int]  # retrieve


class IndexDocument(TypedDict):
    key: str
    text: str
    vector: list[float]


class RetrievalIndex(TypedDict):
    """``GET /api/v1/routing/indexes/<tenant>/<name>/``: a tenant's index as gateways search it."""

    revision: int
    dimensions: int
    documents: list[IndexDocument]


class PipelineRoute(TypedDict):
    """A tenant's pipeline in production: its stages in an order that runs each after its sources. No
    ``stages`` and an ``unavailable`` reason (naming the stage) when a stage cannot run for this tenant
    inside its residency now: the gateway answers 503 and runs nothing."""

    version: str  # "acme/support-rag@1.0.0"
    budget_ms: int
    output: list[str]  # the answering stage, or alternatives of which exactly one runs
    stages: list[PipelineStage]
    unavailable: NotRequired[str]
    # The regions where the tenant's data may be processed: a gateway runs the pipeline only if it serves
    # none but these (its built-in and http stages work on the tenant's data in the gateway itself).
    regions: NotRequired[list[str]]


class TenantRoutes(TypedDict):
    limits: TenantLimits
    blocked: str  # why every new request is refused (a budget's hard limit); '' when it is not
    models: dict[str, Route]
    degraded: NotRequired[str]  # why requests go to fallbacks first (past the budget's degrade threshold)
    pipelines: NotRequired[dict[str, PipelineRoute]]  # by the model name clients call it by


class Credential(TypedDict):
    """What a token digest may do at the gateway: call models for exactly one tenant."""

    tenants: list[str]
    token: str  # the token's prefix, to name it in logs
    expires: float | None  # a Unix timestamp
    priority: NotRequired[str]  # its requests' class (PRIORITIES); absent means INTERACTIVE


class RouteTable(TypedDict, total=False):
    """One generation's content. The control plane always sends every part; a gateway reads each as
    optional (an empty table is "no table yet", and an older control plane sent no ``cache_salts``)."""

    tenants: dict[str, TenantRoutes]  # by tenant slug
    credentials: dict[str, Credential]  # by the SHA-256 hex digest of the token
    cache_salts: dict[str, str]  # each tenant's vLLM cache_salt on shared deployments


class GatewayConfig(TypedDict):
    """The answer to ``GET /api/v1/routing/gateway-config/``."""

    generation: int
    etag: str
    table: RouteTable


class Activation(TypedDict):
    """The body of ``POST /api/v1/routing/activations/``: requests held at a gateway for a route at zero."""

    tenant: str
    model: str  # the name the tenant called, as in its route table
    held: int  # requests this gateway holds for it now


class UsageRecord(TypedDict):
    """One forwarded request, metered once. The gateway always sends every field; the control plane needs
    only ``request_id``, ``tenant`` and ``started_at`` (the rest default) and refuses any other field."""

    request_id: str  # the gateway's own id: the key a re-sent batch is deduplicated by
    client_request_id: NotRequired[str]  # the client's X-Request-ID, for its own correlation only
    tenant: str
    model_name: NotRequired[str]
    region: NotRequired[str]
    deployment: NotRequired[int]
    version: NotRequired[str]
    artifact_sha256: NotRequired[str]
    endpoint: NotRequired[str]
    status: NotRequired[int]  # the HTTP status the client got (499: it went away)
    prompt_tokens: NotRequired[int]
    completion_tokens: NotRequired[int]
    latency_ms: NotRequired[float]
    attempts: NotRequired[int]
    stream: NotRequired[bool]
    ttft_ms: NotRequired[float]  # to the first byte of the answer (a stream's first event)
    # STABLE, CANDIDATE, MIRROR (a shadow copy: never billed to the tenant) or CACHED (answered from the
    # response cache: counted as a request, no GPU cost attributed)
    track: NotRequired[str]
    # Attempts at a rollout's candidate that failed before the first byte and were retried elsewhere: the
    # client never saw them, the rollout's analysis counts them as the candidate's errors.
    candidate_errors: NotRequired[int]
    served_model_name: NotRequired[str]  # a fallback served it: its model name (model_name was asked for)
    degraded: NotRequired[str]  # and why (DEGRADED_REASONS)
    trace_id: NotRequired[str]  # the request's OpenTelemetry trace (32 hex digits), when tracing is on
    # A pipeline's model stage: the pipeline's version ("acme/support-rag@1.0.0") and the stage's name.
    pipeline: NotRequired[str]
    stage: NotRequired[str]
    started_at: str  # ISO 8601 with the offset


USAGE_FIELDS: frozenset[str] = UsageRecord.__required_keys__ | UsageRecord.__optional_keys__
USAGE_REQUIRED_FIELDS: frozenset[str] = UsageRecord.__required_keys__


class UsageBatch(TypedDict):
    """The body of ``POST /api/v1/usage/``."""

    records: list[UsageRecord]
