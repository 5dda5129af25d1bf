"""Best-effort JSON webhooks: the audit event is the record, a webhook only tells someone sooner.

A webhook a tenant may set (a rollout's) is sent only to a public address: the host is resolved when the
webhook is sent and every address must be global, so a tenant cannot make the control plane POST into
its own network (loopback, private ranges, link-local metadata endpoints). Redirects are not followed.
"""

import json
import logging
import socket
import urllib.parse
import urllib.request
from typing import Any

from gateway.addresses import Addresses

log = logging.getLogger(__name__)
PUBLIC_ONLY = Addresses([])  # no network of the operator's: a webhook goes to the public internet only


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def public_host(url: str) -> bool:
    """Whether every address ``url``'s host resolves to is the public internet, by the rule the gateway's
    ``http`` stages use (``gateway.addresses``)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and not any(PUBLIC_ONLY.refused(address) for address in found)


def post_json(url: str, payload: dict[str, Any], timeout: float = 5.0, public_only: bool = False) -> bool:
    """POST ``payload`` to ``url``; False (logged) when it failed or the address was refused."""
    if public_only and not public_host(url):
        log.warning("webhook %s refused: its host is not a public address", url)
        return False
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        urllib.request.build_opener(_NoRedirects).open(request, timeout=timeout).close()
    except Exception as exc:  # best effort: a broken receiver must not break the caller
        log.warning("webhook %s failed: %s", url, exc)
        return False
    return True
