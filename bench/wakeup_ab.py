"""An idle worker's wake-up with and without the claim's walking plan, in one run, message by message.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_wakeup_ab python bench/wakeup_ab.py [--messages 400]

A worker (``Relay``, one delivery thread, the listener) runs in this process; the sender is a connection
of its own. Each message is one ``INSERT`` plus ``NOTIFY`` committed by the sender; the clock runs from
COMMIT's return to the handler's first line (an event, no polling). The messages alternate, in the
order walk, plain, plain, walk: ``walk`` claims through ``store.claiming.walking_plan`` (the setting
and the claim in one pipeline, what every claim of a worker does), ``plain`` claims without it (what a
worker would do if it skipped the walk after a claim that found the backlog empty: measured, not adopted,
docs/performance.md). Prints p50, p90 and p99 of each. Run it on a database of its own: pending messages
of other topics left in the table make every claim of this worker's topic walk past them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_wakeup_ab")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench.tables import ensure_database  # noqa: E402  (needs ROOT on the path)

TOPIC = "bench_ab.wakeup"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400)
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    import psycopg
    from django.core.management import call_command

    from django_outbox import outbox
    from django_outbox.models import Message
    from django_outbox.store import claiming
    from django_outbox.store.producing import _insert_sql
    from django_outbox.worker import Relay, RelayConfig

    call_command("migrate", verbosity=0)
    arrived: dict[int, float] = {}
    came = threading.Event()

    @outbox.handler("bench_ab.*")
    def handler(message: Message) -> None:
        arrived[message.payload["n"]] = time.time()
        came.set()

    real = claiming.walking_plan
    walk = {"on": True}

    @contextlib.contextmanager
    def walking_plan(conn: Any) -> Iterator[None]:
        with real(conn) if walk["on"] else contextlib.nullcontext():
            yield

    claiming.walking_plan = walking_plan
    relay = Relay(RelayConfig.from_settings(topics=["bench_ab.*"], concurrency=1))
    worker = threading.Thread(target=relay.run, daemon=True)
    worker.start()
    time.sleep(2)  # the listener connected
    sql = _insert_sql(True, keyed=False, idempotent=False, notify=True, schedule="now", headers=False)
    ms: dict[bool, list[float]] = {True: [], False: []}
    with psycopg.connect(os.environ["DATABASE_URL"]) as sender:
        for n in range(args.messages):
            walk["on"] = (True, False, False, True)[n % 4]
            sender.execute(sql, [uuid.uuid4(), TOPIC, f'{{"n": {n}}}', 5, "django_outbox"])
            came.clear()
            sender.commit()
            committed = time.time()
            came.wait(5)
            if n in arrived:
                ms[walk["on"]].append((arrived[n] - committed) * 1000)
            time.sleep(random.uniform(0.005, 0.015))
    relay.stop()
    worker.join(timeout=10)
    for on, values in ms.items():
        q = statistics.quantiles(values, n=100)
        print(
            f"{'walk' if on else 'plain':<6} COMMIT's return to handler: p50 {statistics.median(values):.2f}"
            f" / p90 {q[89]:.2f} / p99 {q[98]:.2f} ms ({len(values)} messages)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
