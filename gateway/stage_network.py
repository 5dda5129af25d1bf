"""Where a pipeline's ``http`` stages may connect: never to the gateway's own side of the network
(loopback, private, link-local, reserved and multicast addresses, the cloud metadata address among them),
unless the operator allows some (``GATEWAY_STAGE_NETWORKS``, for tenants' services on a private network).

One rule (``gateway.addresses.Addresses.refused``, which the control plane's webhooks use too), applied
where the address is known: to an IP literal in the URL before the call, and to a name by the resolver of
the session the stages are called with, on the very addresses the connection is made to (resolved once).
A host whose DNS answer changes between a check and the connection (DNS rebinding) therefore cannot be
reached: there is no earlier check to pass.
"""

import errno
import ipaddress
import socket
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.addresses import Addresses

REFUSED = "its service is on a network the gateway does not call"


class StageAddressRefused(OSError):
    """A stage's host resolved to an address the gateway does not call."""


class GuardedResolver(AbstractResolver):
    """Resolves as ``inner`` does, and refuses every answer holding an address ``addresses`` refuses."""

    def __init__(self, addresses: Addresses, inner: AbstractResolver | None = None):
        self.addresses, self.inner = addresses, inner or aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        if any(self.addresses.refused(result["host"]) for result in found):
            raise StageAddressRefused(errno.EACCES, REFUSED)
        return found

    async def close(self) -> None:
        await self.inner.close()


class StageNetwork:
    """The ``http`` stages' way out: the rule, and the session they are called with, whose resolver
    applies it to every name it resolves (an IP literal in a URL, which aiohttp does not resolve, is
    checked by ``check`` before the call)."""

    def __init__(self, allowed: list[str], resolver: AbstractResolver | None = None):
        self.addresses = Addresses(allowed)
        self.resolver = resolver  # the names' resolver under the rule (None: the system's)
        self._session: aiohttp.ClientSession | None = None

    def check(self, url: str) -> str | None:
        """Why the stage may not call ``url`` before any connection, or None. Only an IP literal is
        judged here (aiohttp resolves none); a name is judged by the resolver, on the addresses the
        connection is made to, so it is resolved once."""
        host = urlsplit(url).hostname or ""
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return None  # a name
        return REFUSED if self.addresses.refused(host) else None

    @staticmethod
    def refusal(exc: BaseException) -> str | None:
        """The rule's refusal if ``exc`` is the connection it refused (the host rebound), else None."""
        if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, StageAddressRefused):
            return REFUSED
        return None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # made in the running loop, on first use
            resolver = GuardedResolver(self.addresses, self.resolver)
            connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
