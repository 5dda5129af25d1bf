from celery import shared_task

from billing import hooks, services


@shared_task(name="billing.tasks.evaluate_budgets")
def evaluate_budgets() -> int:
    fired = services.evaluate_budgets()
    hooks.budgets_fired(fired)  # routing listens: a hard limit reaches the gateways with the next table
    return len(fired)
