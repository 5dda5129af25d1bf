"""Who listens to budget alerts. Billing sits below routing, so it cannot republish the route table
itself: routing registers here from its AppConfig.ready(), and billing calls ``budgets_fired`` after
alerts fire, without importing anything above it.

Only types are imported from billing's models, so an AppConfig module may import this one at its top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from billing.models import BudgetAlert

# Called with the alerts an evaluation fired (never with none), after each alert's own transaction committed.
BUDGET_LISTENERS: list[Callable[[list[BudgetAlert]], None]] = []


def on_budgets_fired(
    listener: Callable[[list[BudgetAlert]], None],
) -> Callable[[list[BudgetAlert]], None]:
    if listener not in BUDGET_LISTENERS:  # ready() may run twice (tests that reload apps)
        BUDGET_LISTENERS.append(listener)
    return listener


def budgets_fired(alerts: list[BudgetAlert]) -> None:
    if not alerts:
        return
    for listener in BUDGET_LISTENERS:
        listener(alerts)
