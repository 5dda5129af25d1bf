"""Who uses a model version, and who listens to its lifecycle. Capabilities that consume versions
(deployments) register here, so the registry can refuse to retire a version that still serves and announce
transitions without depending on those apps."""

from collections.abc import Callable

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
    TRANSITION_LISTENERS.append(listener)
    return listener
