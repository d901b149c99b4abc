"""The SSRF guard judges IPv6 forms that embed an IPv4 address by that IPv4 address.

A NAT64 gateway turns ``64:ff9b::7f00:1`` into 127.0.0.1, a 6to4 relay sends ``2002:7f00:1::1`` to
127.0.0.1, and so on: each form is as private as the IPv4 address inside it, and as public.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_outbox import outbox
from django_outbox.models import Message
from django_outbox.webhooks.ssrf import is_public_address as _is_public
from django_outbox.worker import Relay, RelayConfig
from tests.support.servers import HTTPServer

SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"


def teredo(client: str, server: str = "65.54.227.120") -> str:
    """A Teredo address (RFC 4380): 2001:0000, the server, flags and port, then the client inverted."""
    value = (0x20010000 << 96) | (int(ipaddress.IPv4Address(server)) << 64)
    value |= 0x8000 << 48 | 0x63BF << 32  # flags and (obfuscated) port
    value |= int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    return str(ipaddress.IPv6Address(value))


#: (form, refused example embedding a non-public IPv4, allowed example embedding a public one)
FORMS = [
    ("NAT64 64:ff9b::/96", "64:ff9b::7f00:1", "64:ff9b::808:808"),
    ("NAT64 64:ff9b::/96, private", "64:ff9b::a00:1", "64:ff9b::5db8:d822"),
    ("NAT64 local-use 64:ff9b:1::/48 (/96 form)", "64:ff9b:1::7f00:1", "64:ff9b:1::808:808"),
    ("NAT64 local-use 64:ff9b:1::/48 (/48 form)", "64:ff9b:1:7f00:1::", "64:ff9b:1:808:8:800::"),
    ("6to4 2002::/16", "2002:7f00:1::1", "2002:808:808::1"),
    ("6to4 2002::/16, link-local", "2002:a9fe:a9fe::1", "2002:5db8:d822::1"),
    ("Teredo 2001::/32", teredo("127.0.0.1"), teredo("8.8.8.8")),
    ("Teredo 2001::/32, private", teredo("192.168.1.1"), teredo("93.184.216.34")),
    ("IPv4-compatible ::a.b.c.d", "::7f00:1", "::808:808"),
    ("IPv4-compatible ::a.b.c.d, private", "::10.0.0.1", "::93.184.216.34"),
    ("IPv4-mapped ::ffff:a.b.c.d", "::ffff:127.0.0.1", "::ffff:8.8.8.8"),
    ("IPv4-mapped ::ffff:a.b.c.d, metadata", "::ffff:169.254.169.254", "::ffff:93.184.216.34"),
    ("IPv4-translated ::ffff:0:a.b.c.d", "::ffff:0:7f00:1", "::ffff:0:808:808"),
    ("IPv4-translated ::ffff:0:a.b.c.d, shared", "::ffff:0:6440:1", "::ffff:0:5db8:d822"),
]


@pytest.mark.parametrize(("form", "refused", "allowed"), FORMS, ids=[f[0] for f in FORMS])
def test_embedded_ipv4_decides(form: str, refused: str, allowed: str) -> None:
    assert not _is_public(refused), f"{form}: {refused} embeds a non-public IPv4 address"
    assert _is_public(allowed), f"{form}: {allowed} embeds a public IPv4 address"


def test_plain_addresses_are_judged_as_before() -> None:
    refused = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0"]
    refused += ["192.0.2.1", "198.18.0.1", "240.0.0.1", "224.0.0.1", "255.255.255.255"]
    refused += ["::", "::1", "fe80::1", "fc00::1", "ff02::1", "2001:db8::1", "100::1", "not an address"]
    for address in refused:
        assert not _is_public(address), address
    for address in ["8.8.8.8", "2606:2800:220:1:248:1893:25c8:1946", "2a00:1450:4001:82b::200e"]:
        assert _is_public(address), address


def test_a_local_use_nat64_address_is_refused_if_any_prefix_length_reads_a_private_ipv4() -> None:
    # Read as a /96 prefix this is 8.8.8.8, read as a /64 prefix it is 10.0.0.1 (bits 72-103).
    tricky = ipaddress.IPv6Address((0x0064FF9B0001 << 80) | (0x0A000001 << 24) | 0x08080808)
    assert not _is_public(str(tricky))


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_embedding_agrees_with_the_ipv4_address(value: int) -> None:
    v4 = ipaddress.IPv4Address(value)
    public = v4.is_global and not v4.is_multicast
    for prefix in (0xFFFF << 32, 0xFFFF << 48, 0x0064FF9B << 96):  # mapped, translated, NAT64
        assert _is_public(str(ipaddress.IPv6Address(prefix | value))) == public
    assert _is_public(str(ipaddress.IPv6Address((0x2002 << 112) | (value << 80) | 1))) == public  # 6to4
    assert _is_public(teredo(str(v4))) == public
    if value > 1:
        assert _is_public(str(ipaddress.IPv6Address(value))) == public  # IPv4-compatible


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "host", ["64:ff9b::7f00:1", "2002:7f00:1::1", "::7f00:1", "::ffff:127.0.0.1", "::ffff:0:7f00:1", teredo("10.0.0.1")]
)
def test_the_transport_refuses_embedded_private_addresses_at_connect_time(settings, host: str) -> None:
    server = HTTPServer()
    try:
        settings.OUTBOX = {
            **settings.OUTBOX,
            "TRANSPORTS": {
                "hooks": {
                    "BACKEND": "django_outbox.transports.webhook.WebhookTransport",
                    "OPTIONS": {"URL": f"http://[{host}]:{server.port}/hook", "SECRET": SECRET, "TIMEOUT": 2},
                }
            },
            "ROUTES": {"orders.*": "hooks"},
        }
        message = outbox.send("orders.created", {"id": 1})
        Relay(RelayConfig.from_settings(until_empty=True, concurrency=1, poll_interval=0.05, notify=False)).run()
        message.refresh_from_db()
        assert message.status == Message.Status.DEAD
        assert "not a public address" in message.last_error
        assert host in message.last_error
        assert server.requests == []
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_the_transport_lets_an_embedded_public_address_through_the_guard(settings) -> None:
    """No route to the Internet here: the connect fails, but the guard did not refuse it."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "BACKOFF_BASE_SECONDS": 60,
        "BACKOFF_MAX_SECONDS": 60,
        "TRANSPORTS": {
            "hooks": {
                "BACKEND": "django_outbox.transports.webhook.WebhookTransport",
                "OPTIONS": {"URL": "http://[64:ff9b::808:808]:9/hook", "SECRET": SECRET, "TIMEOUT": 1},
            }
        },
        "ROUTES": {"orders.*": "hooks"},
    }
    message = outbox.send("orders.created", {"id": 1})
    Relay(RelayConfig.from_settings(until_empty=True, concurrency=1, poll_interval=0.05, notify=False)).run()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING, message.last_error
    assert "not a public address" not in message.last_error
    assert "Connect" in message.last_error
