"""The suite's tiers: ``unit`` tests run in seconds because they stay inside this Python process.

tests/conftest.py marks them at collection (``pytest -m unit``, ``make test-unit``). Set by hand: ``slow``
on tests that start long-lived processes (engines, a worker, servers), ``browser`` on those that drive
Chromium, ``subprocess`` on the quick ones that run a child process themselves (not through a fixture), and
``heavy`` on the few that stay in the process but take many seconds (a property search, vLLM's import).
"""

import pytest

# Fixtures that reach outside this Python process: the database (every way in to it, db, transactional_db,
# admin_client, world..., goes through django_db_setup), the live server, a Celery worker, Prometheus and
# the browser. A test's fixturenames holds every fixture it needs, however indirectly.
BEYOND_THE_PROCESS = frozenset(
    {
        "django_db_setup",
        "live_server",
        "django_assert_num_queries",
        "django_assert_max_num_queries",
        "celery_worker",
        "prometheus",
        "browser",
    }
)


def is_unit(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) for name in ("django_db", "slow", "browser", "subprocess", "heavy")):
        return False
    return not BEYOND_THE_PROCESS.intersection(getattr(item, "fixturenames", ()))
