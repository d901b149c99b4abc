"""One producer process of the ``enqueue`` and ``keyed`` figures: rounds of one-row business transactions.

    python bench/producer.py GO_DIR TRANSACTIONS

Round ``i`` starts when ``GO_DIR/go-<i>`` appears and runs TRANSACTIONS of the mode it names, each an
order plus: ``send`` (``outbox.send()``), ``send_quiet`` (NOTIFY off), ``floor`` (one hand-written INSERT
into the minimal table), ``floor_notify`` (and ``pg_notify``), ``key_one`` (NOTIFY off, every producer on
one key) or ``key_many`` (a key per transaction). Prints ``ready``, then ``done <i> <seconds>`` per round.
"""

import itertools
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
import django

django.setup()
from bench.common import business_transaction, execute, order_payload  # noqa: E402
from bench.figures import outbox_settings  # noqa: E402
from bench.minimal_relay import INSERT_ONE  # noqa: E402
from django_outbox import outbox  # noqa: E402


def write(mode: str, i: int, order: Any) -> None:
    payload = order_payload(order)
    if mode.startswith("floor"):
        execute(INSERT_ONE, [json.dumps(payload)])
        if mode == "floor_notify":
            execute("SELECT pg_notify('django_outbox', '')")
    else:
        outbox.send("bench.noop", payload, key={"key_one": "one", "key_many": f"{os.getpid()}-{i}"}.get(mode))


go_dir, transactions = Path(sys.argv[1]), int(sys.argv[2])
for i in range(3):  # warm-up: connection, caches, plans
    business_transaction(i, partial(write, "send", i))
    business_transaction(i, partial(write, "floor", i))
print("ready", flush=True)
for number in itertools.count():  # until SIGTERM
    while not (go_dir / f"go-{number}").exists():
        time.sleep(0.001)
    mode = (go_dir / f"go-{number}").read_text()
    started = time.perf_counter()
    with outbox_settings(NOTIFY=mode not in ("send_quiet", "key_one", "key_many")):
        for i in range(transactions):
            business_transaction(i, partial(write, mode, i))
    print(f"done {number} {time.perf_counter() - started!r}", flush=True)
