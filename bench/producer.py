"""One producer process of the enqueue figures: rounds of one-row business transactions.

    python bench/producer.py GO_DIR TRANSACTIONS MODE [MODE ...]

Round ``i`` starts when ``GO_DIR/go-<i>`` appears (once every producer is ready: start-up is not timed)
and runs TRANSACTIONS of MODE, each an order plus: ``send`` (``outbox.send()``), ``send_quiet`` (NOTIFY
off), ``floor`` (one hand-written INSERT into the minimal table), ``floor_notify`` (and ``pg_notify``),
``key_one`` (NOTIFY off, every producer on one key) or ``key_many`` (a key per transaction). Prints
``ready``, then ``done <i> <seconds>`` per round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"


def main() -> None:
    import django

    django.setup()
    from bench.common import business_transaction, execute, order_payload
    from bench.figures import outbox_settings
    from bench.minimal_relay import INSERT_ONE
    from django_outbox import outbox

    go_dir, transactions, modes = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]

    def write(mode: str, i: int, order: Any) -> None:
        payload = order_payload(order)
        if mode in ("send", "send_quiet"):
            outbox.send("bench.noop", payload)
        elif mode == "key_one":
            outbox.send("bench.noop", payload, key="one")
        elif mode == "key_many":
            outbox.send("bench.noop", payload, key=f"{os.getpid()}-{i}")
        else:
            execute(INSERT_ONE, [json.dumps(payload)])
            if mode == "floor_notify":
                execute("SELECT pg_notify('django_outbox', '')")

    for i in range(3):  # warm-up: connection, caches, plans
        business_transaction(i, partial(write, "send", i))
        business_transaction(i, partial(write, "floor", i))
    print("ready", flush=True)
    for number, mode in enumerate(modes):
        while not (go_dir / f"go-{number}").exists():
            time.sleep(0.001)
        started = time.perf_counter()
        with outbox_settings(NOTIFY=mode not in ("send_quiet", "key_one", "key_many")):
            for i in range(transactions):
                business_transaction(i, partial(write, mode, i))
        print(f"done {number} {time.perf_counter() - started!r}", flush=True)


if __name__ == "__main__":
    main()
