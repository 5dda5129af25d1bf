"""Run the routing loop: probe every endpoint each second, publish the route table when it changes."""

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from routing.health import PROBE_INTERVAL_SECONDS, run_forever


class Command(BaseCommand):
    help = "Probe engine endpoints and publish the route table (part of `serve`)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=PROBE_INTERVAL_SECONDS)
        parser.add_argument("--rounds", type=int, default=None, help="stop after this many (default: never)")

    def handle(self, *args: Any, **opts: Any) -> None:
        # SIGTERM is how an orchestrator (or `serve`) stops it: unwind, so the loop hands its lease on.
        signal.signal(signal.SIGTERM, _exit)
        run_forever(opts["interval"], opts["rounds"])


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)
