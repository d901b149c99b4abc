"""The consumer's effect and its faults, shared by the outbox handler and the Redis stream consumer.

The effect is one ``Effect`` row and an ``Account`` balance increment, written in the transaction that
``inbox.receive()`` opens for the receipt, so the receipt and the effect commit or roll back together.
With ``CHAOS_CONSUMER_INBOX=0`` the same writes run in a plain ``transaction.atomic()`` instead: the
consumer one might write without the inbox, which the run must catch applying effects twice.

A message's payload may carry a ``fault``, which strikes once, the first time a delivery of the message
reaches the fault's point in a consumer (``armed``: not in the fault log yet):

- ``kill_in_transaction``: SIGKILL after the effect's writes, before the commit;
- ``kill_after_commit``: SIGKILL after the commit, before the delivery is acknowledged (the worker's
  record of the attempt, or the stream consumer's ``XACK``);
- ``raise_in_transaction``: raise after the effect's writes (effect and receipt roll back);
- ``raise_after_commit``: raise after the commit (the delivery fails although the effect stands).

Each fault is logged to the file ``CHAOS_FAULT_LOG`` (one line, written before it strikes), which the
run counts, and which the consumers read to strike each fault only once.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import F

from django_outbox import inbox

from .models import Account, Effect

SOURCE = "chaos"


class ConsumerFailure(Exception):
    pass


def faults_struck() -> set[str]:
    """The message uuids whose fault has struck already (a SIGKILL leaves its line: it is written first)."""
    path = os.environ.get("CHAOS_FAULT_LOG")
    if not path:
        raise RuntimeError("chaos consumer: CHAOS_FAULT_LOG is not set, so a fault could strike again and again")
    if not Path(path).exists():
        return set()
    return {line.split()[1] for line in Path(path).read_text().splitlines() if line.strip()}


def _strike(payload: dict[str, Any], where: str, armed: bool, message_uuid: str) -> None:
    fault = payload.get("fault")
    if not armed or not isinstance(fault, str) or not fault.endswith(where):
        return
    path = os.environ.get("CHAOS_FAULT_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # In the page cache: survives the SIGKILL below. The pid says which process the fault ended, so
            # the harness tells a worker that killed itself from one it killed (they may land together).
            os.write(fd, f"{fault} {message_uuid} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
    if fault.startswith("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    raise ConsumerFailure(f"chaos consumer: {fault} as requested")


@contextmanager
def _effect_transaction(message_uuid: str) -> Iterator[bool]:
    """Yield whether the message was processed before: never, without the inbox."""
    if os.environ.get("CHAOS_CONSUMER_INBOX", "1") == "1":
        with inbox.receive(SOURCE, message_uuid) as receipt:
            yield receipt.duplicate
    else:
        with transaction.atomic():
            yield False


def consume(message_uuid: str | uuid.UUID, payload: dict[str, Any], *, attempt: int, armed: bool) -> None:
    """Apply the message's effect once (with the inbox), in the consumer's own transaction."""
    message_uuid = str(message_uuid)
    with _effect_transaction(message_uuid) as duplicate:
        if not duplicate:
            Effect.objects.create(
                message_uuid=message_uuid,
                account=payload["account"],
                amount=payload["amount"],
                attempt=attempt,
                pid=os.getpid(),
            )
            updated = Account.objects.filter(name=payload["account"]).update(
                balance=F("balance") + payload["amount"], applied=F("applied") + 1
            )
            if updated != 1:
                raise ConsumerFailure(f"chaos consumer: no account {payload['account']!r}")
            _strike(payload, "in_transaction", armed, message_uuid)
    _strike(payload, "after_commit", armed, message_uuid)
