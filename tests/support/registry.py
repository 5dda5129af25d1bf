"""Registry fixtures: a realistic 8B chat model of tenant A, registered through the services."""

import hashlib
from pathlib import Path
from typing import Any

from core.principal import Principal
from registry.models import ModelVersion, RegisteredModel
from registry.services.lifecycle import version_transition
from registry.services.reports import report_submit
from registry.services.versions import version_register

POLICY = [
    {"metric": "mmlu", "min": 0.6},
    {"metric": "ttft_p95_ms", "max": 800},
    {"metric": "output_tokens_per_s", "max_regression_pct": 10},
]
GOOD_METRICS = {
    "metrics": {"mmlu": 0.66},
    "performance": {"ttft_p95_ms": 350.0, "output_tokens_per_s": 1200.0},
}


def version_payload(version: str = "1.0.0", sha: str = "a" * 64, **overrides: Any) -> dict[str, Any]:
    return {
        "version": version,
        "artifact_uri": f"s3://models/llama-3-8b/{version}/",
        "artifact_sha256": sha,
        "artifact_size_bytes": 16_060_522_496,
        "artifact_format": "safetensors",
        "artifact_manifest": [
            {"path": "config.json", "sha256": "b" * 64, "size_bytes": 654},
            {"path": "model-00001-of-00004.safetensors", "sha256": sha, "size_bytes": 4_976_698_672},
        ],
        "served_model_name": "llama-3-8b-instruct",
        "runtime_version": "0.33.0",
        "runtime_image": "vllm/vllm-openai:v0.33.0",
        "tokenizer_ref": "meta-llama/Meta-Llama-3-8B-Instruct",
        "tokenizer_sha256": "c" * 64,
        "prompt_template_version": "llama3-chat-v2",
        "engine_args": {"max_model_len": 8192, "enable_prefix_caching": True, "gpu_memory_utilization": 0.9},
        "max_context_length": 8192,
        "parameter_count": 8_030_261_248,
        "dtype": "bfloat16",
        "architecture": {
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
        },
        "allowed_jurisdictions": ["EU", "CH"],
        "ci_pipeline_url": "https://ci.example.com/pipelines/42",
        "source_commit": "0123abcd",
        **overrides,
    }


def register(
    model: RegisteredModel, actor: Principal, version: str = "1.0.0", **overrides: Any
) -> ModelVersion:
    sha = overrides.pop("sha", hashlib.sha256(version.encode()).hexdigest())
    found, _ = version_register(actor=actor, model=model, **version_payload(version, sha, **overrides))
    return found


def register_file(
    model: RegisteredModel, actor: Principal, version: str, path: Path, sha: str = "", **overrides: Any
) -> ModelVersion:
    """A version whose weights are the one file at ``path``, declared with ``sha`` (by default its own)."""
    declared = sha or hashlib.sha256(path.read_bytes()).hexdigest()
    return register(
        model, actor, version, artifact_uri=f"file://{path}", sha=declared, artifact_manifest=[], **overrides
    )


def advance(
    version: ModelVersion, actor: Principal, to: str, metrics: dict[str, Any] | None = None
) -> ModelVersion:
    """Walk a version along the happy path up to ``to`` (reports and override included)."""
    path = ["validating", "validated", "staged", "canary", "production"]
    for state in path[: path.index(to) + 1]:
        if state == "validated":
            report_submit(actor=actor, version=version, **(metrics or GOOD_METRICS))
        version_transition(
            actor=actor, version=version, to=state, reason=f"to {state}", override=state == "production"
        )
    return version
