from celery import shared_task


@shared_task(name="billing.tasks.evaluate_budgets")
def evaluate_budgets() -> int:
    from billing.services import evaluate_budgets as evaluate
    from routing.services import publish

    fired = evaluate()
    if fired:
        publish()  # a hard limit reaches the gateways with the next table generation
    return len(fired)
