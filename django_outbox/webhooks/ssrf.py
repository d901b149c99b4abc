"""Which addresses a webhook may connect to: the policy of the transport's server-side request forgery guard.

The transport resolves each host itself and asks ``is_public_address()`` about every address it got,
at connect time (see ``transport._GuardedBackend``); this module only judges addresses, so it needs
neither httpx nor the network. docs/transports/webhooks.md lists every refused form.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_public_address"]

#: IPv6 prefixes that carry an IPv4 address in their last 32 bits, each judged by that IPv4 address:
#: the NAT64 well-known prefix (RFC 6052), IPv4-translated (RFC 2765) and the deprecated
#: IPv4-compatible form (RFC 4291). IPv4-mapped, 6to4 and Teredo have their own accessors in
#: ``ipaddress``; the local-use NAT64 prefix (RFC 8215) is handled apart, see ``_local_nat64``.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _local_nat64(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address an address of ``64:ff9b:1::/48`` may stand for.

    An operator picks the length of a local-use NAT64 prefix (/48, /56, /64 or /96 inside that /48),
    and the IPv4 address sits at a different place for each (RFC 6052 section 2.2, skipping bits 64 to
    71), which the address alone does not tell: the guard reads it every way. Readings in 0.0.0.0/8
    are the zero padding of another prefix length, never a destination, and are left out; the address
    is public only if some reading is left and every one left is public.
    """
    bits = format(int(ip), "0128b")
    bits = bits[:64] + bits[72:]  # without the reserved "u" octet
    starts = (48, 56, 64, 88)  # where the IPv4 address begins, once that octet is gone, for /48 /56 /64 /96
    readings = [ipaddress.IPv4Address(int(bits[start : start + 32], 2)) for start in starts]
    return [v4 for v4 in readings if int(v4) >> 24 != 0]


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a packet to ``ip`` really reaches, for the IPv6 forms that embed one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client, whose address Teredo stores inverted; ipaddress undoes that
    if ip in _NAT64 or ip in _TRANSLATED or (ip in _COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public_address(address: str) -> bool:
    """Whether a webhook may connect to ``address``: a global unicast address, judged by the IPv4
    address it embeds for the IPv6 forms that translate or tunnel to IPv4 (``64:ff9b::7f00:1`` is
    127.0.0.1 behind a NAT64 gateway, so it is as private as 127.0.0.1)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL:
            readings = _local_nat64(ip)
            return bool(readings) and all(v4.is_global and not v4.is_multicast for v4 in readings)
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            return embedded.is_global and not embedded.is_multicast
    return ip.is_global and not ip.is_multicast
