"""What changed between two versions of a model: engine arguments, artifacts, templates, runtime."""

from typing import Any

from registry.models import ModelVersion

SECTIONS = {
    "artifact": ("artifact_uri", "artifact_sha256", "artifact_size_bytes", "artifact_format"),
    "runtime": ("runtime_version", "runtime_image", "served_model_name"),
    "tokenizer": ("tokenizer_ref", "tokenizer_sha256"),
    "templates": ("prompt_template_version", "chat_template"),
    "sizing": ("max_context_length", "parameter_count", "dtype", "quantization", "architecture"),
    "governance": ("data_classification", "allowed_jurisdictions", "compliance_tags", "owner_contact"),
}


def _engine_args(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"field": f"engine_args.{k}", "from": a.get(k), "to": b.get(k)}
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def _manifest(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, list[str]]:
    left, right = {e["path"]: e for e in a}, {e["path"]: e for e in b}
    return {
        "added": sorted(set(right) - set(left)),
        "removed": sorted(set(left) - set(right)),
        "changed": sorted(p for p in set(left) & set(right) if left[p] != right[p]),
    }


def version_diff(a: ModelVersion, b: ModelVersion) -> dict[str, Any]:
    sections: dict[str, list[dict[str, Any]]] = {
        name: [
            {"field": f, "from": getattr(a, f), "to": getattr(b, f)}
            for f in fields
            if getattr(a, f) != getattr(b, f)
        ]
        for name, fields in SECTIONS.items()
    }
    sections["engine_args"] = _engine_args(a.engine_args, b.engine_args)
    return {
        "from": a.version,
        "to": b.version,
        "sections": sections,
        "manifest": _manifest(a.artifact_manifest, b.artifact_manifest),
    }


def lineage(version: ModelVersion) -> list[dict[str, Any]]:
    """The version and its ancestors (``parent`` links), newest first, with what identifies each."""
    chain: list[dict[str, Any]] = []
    seen: set[int] = set()
    current: ModelVersion | None = version
    while current is not None and current.pk not in seen:
        seen.add(current.pk)
        chain.append(
            {
                "version": current.version,
                "status": current.status,
                "artifact_sha256": current.artifact_sha256,
                "tokenizer_sha256": current.tokenizer_sha256,
                "runtime_image": current.runtime_image,
                "created_by": current.created_by_name,
                "ci_pipeline_url": current.ci_pipeline_url,
                "source_commit": current.source_commit,
                "created_at": current.created_at,
            }
        )
        current = current.parent
    return chain
