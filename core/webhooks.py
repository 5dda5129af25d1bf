"""Best-effort JSON webhooks: the audit event is the record, a webhook only tells someone sooner."""

import json
import logging
import urllib.request
from typing import Any

log = logging.getLogger(__name__)


def post_json(url: str, payload: dict[str, Any], timeout: float = 5.0) -> bool:
    """POST ``payload`` to ``url``; False (logged) when it failed."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
    except OSError as exc:
        log.warning("webhook %s failed: %s", url, exc)
        return False
    return True
