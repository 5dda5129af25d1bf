"""The Grafana dashboards under docs/grafana/: every PromQL expression in them parses and returns series on
a real Prometheus scraping a real gateway process and the engines behind it, after some traffic."""

import contextlib
import json
import re
import shutil
from pathlib import Path

import pytest
import requests

from regions.models import DeploymentTarget
from routing import services
from tests.support.gateway import chat
from tests.support.processes import wait_for
from tests.support.prometheus import NOT_INSTALLED

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("prometheus"), reason=NOT_INSTALLED),
]
BOARDS = sorted((Path(__file__).resolve().parents[2] / "docs" / "grafana").glob("*.json"))
VARIABLES = {"$__rate_interval": "1m", "$tenant": ".*", "$model": ".*"}


def expressions() -> list[tuple[str, str, str]]:
    found = []
    for board in BOARDS:
        for panel in json.loads(board.read_text())["panels"]:
            found += [(board.name, panel["title"], target["expr"]) for target in panel["targets"]]
    return found


def test_the_dashboards_are_there_and_well_formed():
    assert {b.name for b in BOARDS} == {"fleet.json", "models.json", "tenants.json", "rollouts.json"}
    for board in BOARDS:
        body = json.loads(board.read_text())
        assert body["uid"] and body["title"] and body["panels"]
        used = set(re.findall(r"\$(\w+)", json.dumps(body["panels"])))
        declared = {v["name"] for v in body["templating"]["list"]} | {"__rate_interval"}
        assert used <= declared, (board.name, used - declared)


def test_every_expression_returns_series_on_a_real_prometheus(world, fleet, prometheus):
    url, scrape = prometheus
    engines = [
        u for t in DeploymentTarget.objects.filter(deployment=fleet["deployment"]) for u in t.endpoints
    ]
    scrape([fleet["gateway"].url, *engines])
    world.tenant_a.requests_per_minute = 4
    world.tenant_a.save()
    generation = services.publish().generation
    wait_for(lambda: fleet["gateway"].generation() == generation, timeout=10)
    for n in range(6):  # four answered, two refused: a rate limit
        chat(fleet["gateway"], fleet["tokens"]["alice"], stream=n % 2 == 0)
    targets = 1 + len(engines)

    def scraped_twice() -> bool:  # every target up, and two samples of the requests counter since the traffic
        query = {
            "query": "count(count_over_time(gateway_requests_total[20s]) >= 2) and count(up == 1) == "
            + str(targets)
        }
        return bool(requests.get(f"{url}/api/v1/query", params=query, timeout=10).json()["data"]["result"])

    wait_for(scraped_twice, timeout=60, interval=1)
    failures: list[tuple[str, str, str, str]] = []

    def every_expression_answers() -> bool:  # rates need two scrapes after the traffic: asked until they have
        failures.clear()
        for board, title, expr in expressions():
            query = expr
            for name, value in VARIABLES.items():
                query = query.replace(name, value)
            reply = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=10).json()
            if reply["status"] != "success" or not reply["data"]["result"]:
                failures.append((board, title, query, reply.get("error") or "no series"))
        return not failures

    with contextlib.suppress(AssertionError):  # the assertion below names what never answered
        wait_for(every_expression_answers, timeout=30, interval=2)
    assert not failures, failures
