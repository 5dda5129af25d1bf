"""Which addresses are the public internet: the one rule for every outbound call a tenant can aim (a
pipeline's ``http`` stages in the gateway, a rollout's webhook from the control plane). Loopback, private,
link-local, shared carrier-grade, reserved and multicast addresses are not, also when an IPv6 form carries
one (mapped, 6to4, Teredo); an operator may allow networks of its own. Free of Django and of aiohttp, so
both sides import it.
"""

import ipaddress


class Addresses:
    """The rule, with the networks an operator allows on top of the public internet (none by default)."""

    def __init__(self, allowed: list[str]):
        self.allowed = [ipaddress.ip_network(n, strict=False) for n in allowed]

    def refused(self, address: str) -> bool:
        """Whether ``address`` is not the public internet (private, loopback, link-local, shared
        carrier-grade space such as 100.100.100.200, reserved, multicast), seen through the IPv6 forms
        that carry an IPv4 address (mapped, 6to4, Teredo), unless the operator allowed its network."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone is not part of the address
        if any(ip in network for network in self.allowed):
            return False
        if isinstance(ip, ipaddress.IPv6Address):
            carried = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
            if carried is not None and self.refused(str(carried)):
                return True
        return not ip.is_global or ip.is_multicast
