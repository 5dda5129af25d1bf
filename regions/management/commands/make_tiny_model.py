from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from regions.engines.tiny_model import write_tiny_model


class Command(BaseCommand):
    help = "Write a tiny random-weight Llama that vLLM serves with --load-format dummy."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", nargs="?", default=str(settings.VAR_DIR / "models" / "tiny-llama"))

    def handle(self, *args: Any, **opts: Any) -> None:
        self.stdout.write(str(write_tiny_model(Path(opts["directory"]))))
