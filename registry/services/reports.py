"""Validation reports: CI posts numbers; the server evaluates them against the model's policy."""

from dataclasses import asdict
from typing import Any

from django.db import transaction

from core.choices import Scope
from core.errors import Conflict, ValidationFailed
from core.principal import Principal
from core.services.audit import audit_record
from registry import selectors
from registry.choices import ReportOutcome, VersionStatus
from registry.models import ModelVersion, ValidationReport
from registry.policy import PERFORMANCE_METRICS, evaluate, parse_metrics, parse_policy
from registry.services.access import require_on_model

REPORTABLE_STATES = frozenset({VersionStatus.DRAFT, VersionStatus.VALIDATING})


def report_submit(
    *,
    actor: Principal,
    version: ModelVersion,
    metrics: Any,
    performance: Any = None,
    hardware: Any = None,
    ci_pipeline_url: str = "",
) -> ValidationReport:
    require_on_model(actor, version.model, Scope.REGISTRY_WRITE)
    if version.status not in REPORTABLE_STATES:
        raise Conflict(f"{version} is {version.status}; reports are accepted while draft or validating.")
    quality = parse_metrics(metrics, "metrics")
    perf = parse_metrics(performance or {}, "performance")
    unknown = set(perf) - set(PERFORMANCE_METRICS)
    if unknown:
        raise ValidationFailed(
            f"Unknown performance metric(s) {', '.join(sorted(unknown))}; "
            f"use {', '.join(PERFORMANCE_METRICS)}."
        )
    if hardware is not None and not isinstance(hardware, dict):
        raise ValidationFailed('hardware must be an object, e.g. {"gpu_type": "L4", "gpu_count": 1}.')
    baseline_version, baseline = selectors.production_baseline(version.model)
    results = evaluate(parse_policy(version.model.validation_policy), {**quality, **perf}, baseline)
    report = ValidationReport(
        version=version,
        metrics=quality,
        performance=perf,
        hardware=hardware or {},
        outcome=ReportOutcome.PASSED if all(r.passed for r in results) else ReportOutcome.FAILED,
        evaluation=[asdict(r) for r in results],
        ci_pipeline_url=ci_pipeline_url,
        created_by_name=actor.name,
    )
    with transaction.atomic():
        report.save()
        audit_record(
            actor=actor,
            action="validation_report.submitted",
            target=version,
            tenant=version.model.owner,
            after={
                "report": report.pk,
                "outcome": report.outcome,
                "metrics": {**quality, **perf},
                "baseline_version": baseline_version.version if baseline_version else None,
            },
        )
    return report
