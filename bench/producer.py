"""One producer process for the enqueue-concurrency figure: rounds of one-row business transactions.

    python bench/producer.py GO_DIR TRANSACTIONS MODE [MODE ...]

Round ``i`` starts when the file ``GO_DIR/go-<i>`` appears (the harness creates it once every producer
is ready, so start-up is never timed) and runs TRANSACTIONS transactions of MODE, each creating one
``shop.Order`` and then: ``send`` (``outbox.send()``, NOTIFY on), ``send_quiet`` (the same with
``OUTBOX["NOTIFY"] = False``), ``floor`` (one hand-written INSERT into the minimal table) or
``floor_notify`` (the same plus ``pg_notify``); ``key_one`` (``send()`` with NOTIFY off, every producer on
one key: they queue for its lock) or ``key_many`` (the same, each transaction on a key of its own). Prints
``ready``, then ``done <i> <seconds>`` per round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"


def main() -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection, transaction
    from django.test import override_settings

    from bench.minimal_relay import INSERT_ONE
    from django_outbox import outbox
    from testproject.shop.models import Order

    go_dir, transactions, modes = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    quiet = override_settings(OUTBOX={**settings.OUTBOX, "NOTIFY": False})

    def one(mode: str, i: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3)
            payload = {"order_id": order.pk, "item": order.item, "quantity": order.quantity}
            if mode in ("send", "send_quiet"):
                outbox.send("bench.noop", payload)
            elif mode == "key_one":
                outbox.send("bench.noop", payload, key="one")
            elif mode == "key_many":
                outbox.send("bench.noop", payload, key=f"{os.getpid()}-{i}")
            else:
                with connection.cursor() as cursor:
                    cursor.execute(INSERT_ONE, [json.dumps(payload)])
                    if mode == "floor_notify":
                        cursor.execute("SELECT pg_notify('django_outbox', '')")

    for i in range(3):  # warm-up: connection, caches, plans
        one("send", i)
        one("floor", i)
    print("ready", flush=True)
    for round_number, mode in enumerate(modes):
        go = go_dir / f"go-{round_number}"
        while not go.exists():
            time.sleep(0.001)
        started = time.perf_counter()
        if mode in ("send_quiet", "key_one", "key_many"):
            with quiet:
                for i in range(transactions):
                    one(mode, i)
        else:
            for i in range(transactions):
                one(mode, i)
        print(f"done {round_number} {time.perf_counter() - started!r}", flush=True)


if __name__ == "__main__":
    main()
