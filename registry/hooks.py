"""Who uses a model version, and who listens to its lifecycle. Capabilities that consume versions
(deployments, artifacts) register here from their AppConfig.ready(), so the registry can refuse to retire a
version that still serves and announce registrations and transitions without depending on those apps.

Only types are imported from the registry's models, so an AppConfig module may import this one at its top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from registry.models import ModelVersion

# Each checker returns human-readable descriptions of what uses the version (empty: unused).
USAGE_CHECKERS: list[Callable[[ModelVersion], list[str]]] = []


def register_usage_checker(
    checker: Callable[[ModelVersion], list[str]],
) -> Callable[[ModelVersion], list[str]]:
    USAGE_CHECKERS.append(checker)
    return checker


def version_users(version: ModelVersion) -> list[str]:
    return [user for checker in USAGE_CHECKERS for user in checker(version)]


# Called after a version entered a state (once the transition commits), e.g. to copy weights ahead.
TRANSITION_LISTENERS: list[Callable[[ModelVersion, str], None]] = []


def on_transition(listener: Callable[[ModelVersion, str], None]) -> Callable[[ModelVersion, str], None]:
    if listener not in TRANSITION_LISTENERS:  # ready() may run twice (tests that reload apps)
        TRANSITION_LISTENERS.append(listener)
    return listener


# Called after a new version was registered (once the registration commits), e.g. to ingest its weights.
REGISTER_LISTENERS: list[Callable[[ModelVersion], None]] = []


def on_register(listener: Callable[[ModelVersion], None]) -> Callable[[ModelVersion], None]:
    if listener not in REGISTER_LISTENERS:
        REGISTER_LISTENERS.append(listener)
    return listener


# Each returns why the version has earned production (e.g. "rollout 12 succeeded"), or '' when it has not:
# the production gate passes without an override when one of them vouches for the version.
PRODUCTION_EVIDENCE: list[Callable[[ModelVersion], str]] = []


def on_production_evidence(check: Callable[[ModelVersion], str]) -> Callable[[ModelVersion], str]:
    if check not in PRODUCTION_EVIDENCE:
        PRODUCTION_EVIDENCE.append(check)
    return check


def production_evidence(version: ModelVersion) -> str:
    return next((found for check in PRODUCTION_EVIDENCE if (found := check(version))), "")
