"""What ``manage.py check`` says about a setting, and the values the checks and the real servers are compared on.

The unit tests compare the checks' verdicts with these tables; the db and integration tests compare
the tables with what PostgreSQL and NATS really take.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.test import override_settings

from .database import connect_raw


def outbox_errors() -> list[str]:
    """The django_outbox ids ``run_checks()`` reports for the settings in force."""
    return sorted({m.id for m in checks.run_checks() if m.id and m.id.startswith("django_outbox.")})


def outbox_ids(**outbox: Any) -> list[str]:
    """The django_outbox ids ``manage.py check`` reports for ``OUTBOX``; a check that raises fails the test."""
    with override_settings(OUTBOX=outbox):
        return sorted({m.id for m in checks.run_checks() if m.id and m.id.startswith("django_outbox.")})


#: Channel names PostgreSQL refuses in pg_notify() and LISTEN (probed against the server, see below).
REFUSED_CHANNELS = [
    "a" * 64,  # longer than NAMEDATALEN - 1 = 63 bytes
    "\u00e9" * 32,  # 32 characters, 64 bytes in UTF-8
    "\U0001f600" * 16,  # 16 characters, 64 bytes
    "",  # "channel name cannot be empty"
    "a\x00b",  # text cannot hold NUL
    "\ud800",  # a lone surrogate cannot be sent as UTF-8 at all
]
#: Channel names PostgreSQL takes, however odd: LISTEN quotes the identifier, pg_notify() takes text.
ACCEPTED_CHANNELS = [
    "django_outbox",
    "a" * 63,
    "\u00e9" * 31 + "a",
    "\U0001f600" * 15,
    'a"b',
    "a'b",
    "a b",
    "UPPER",
    "1abc",
    "\u65e5\u672c\u8a9e",
    "a;b",
    "\t",
    "a\nb",
]


def server_takes_channel(channel: str) -> bool:
    """Whether this PostgreSQL server LISTENs on ``channel`` and delivers a pg_notify() sent to it."""
    import psycopg
    from psycopg import sql

    try:
        with connect_raw(autocommit=True) as listener, connect_raw(autocommit=True) as sender:
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            sender.execute("SELECT pg_notify(%s, 'ping')", [channel])
            return [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["ping"]
    except (psycopg.Error, UnicodeError):
        return False


#: Stream names and subject templates, and whether the real NATS server takes them (probed: nats-py refuses
#: stream names with . * > / \ or whitespace, the server NUL; a subject with whitespace is refused by the
#: client, one with an empty token ("a..b", "a.") gets no answer from JetStream).
NATS_STREAMS = [("OUTBOX", True), ("OUT_BOX-1", True), ("\u00c9V\u00c9NEMENTS", True), ("A.B", False), ("A B", False)]
NATS_STREAMS += [("A*", False), ("A>", False), ("A/B", False), ("A\\B", False), ("A\x00", False), ("", False)]
NATS_SUBJECTS = [("{topic}", True), ("outbox.{topic}", True), ("a b.{topic}", False), ("a..{topic}", False)]
NATS_SUBJECTS += [("{topic}.", False), (".{topic}", False), ("a\t{topic}", False), ("x.{topic}\n", False)]
