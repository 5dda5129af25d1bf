"""Configuration checks (``manage.py check``, run by ``migrate`` and ``serve``): an ``ARTIFACT_SOURCES``
entry that is no prefix at all would admit nothing, silently."""

from typing import Any

from django.core.checks import Error, register

from registry.sources import malformed_sources


@register()
def artifact_sources(**_: Any) -> list[Error]:
    bad = malformed_sources()
    if not bad:
        return []
    return [
        Error(
            f"ARTIFACT_SOURCES has entries that are no URI prefix we read: {', '.join(bad)}.",
            hint="Use absolute prefixes such as file:///srv/models, s3://bucket/ or https://host/path/.",
            id="registry.E001",
        )
    ]
