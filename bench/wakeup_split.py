"""Where an idle worker's wake-up goes: COMMIT's return to the handler, split into stages, message by message.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_wakeup_split python bench/wakeup_split.py [--messages 300]

A worker (``Relay``, the default delivery threads, the listener) runs in this process and the sender
is a connection of its own, as in ``bench/wakeup_ab.py``. The worker's steps are wrapped to take a
timestamp (``time.perf_counter``, one clock, one process): the listener's socket readable, the
doorbell rung, the delivery thread back from its wait, the claim begun, its statement sent and its
reply read (the pipeline closed), the rows turned into messages, the handler's first line. Prints the
median and p90 of each stage's end after COMMIT returned, and of each stage's own length. Run it on a
database of its own.
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
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_wakeup_split")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench.tables import ensure_database  # noqa: E402  (needs ROOT on the path)

TOPIC = "bench_split.wakeup"
#: The stages, in the order they happen.
STAGES = ("readable", "rung", "woke", "claim", "sent", "replied", "claimed", "handler")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=None)
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"])

    import django

    django.setup()
    import psycopg
    from django.core.management import call_command

    from django_outbox import outbox, store
    from django_outbox.models import Message
    from django_outbox.store import claiming
    from django_outbox.store.producing import _insert_sql
    from django_outbox.worker import Relay, RelayConfig
    from django_outbox.worker import listener as listener_module

    call_command("migrate", verbosity=0)
    now = time.perf_counter
    marks: dict[str, float] = {}  # this message's first time at each stage
    came = threading.Event()

    def mark(stage: str) -> None:
        marks.setdefault(stage, now())

    @outbox.handler("bench_split.*")
    def handler(message: Message) -> None:
        mark("handler")
        came.set()

    import select as select_module

    real_select = select_module.select

    class Select:
        @staticmethod
        def select(*a: Any) -> Any:
            result = real_select(*a)
            mark("readable")
            return result

    setattr(listener_module, "select", Select)  # noqa: B010  (the module's own name, not exported)
    real_walk = claiming.walking_plan

    @contextlib.contextmanager
    def walking_plan(conn: Any) -> Iterator[None]:
        with real_walk(conn):
            mark("sent")  # the pipeline's first statement sent; the claim is executed inside
            yield
        mark("replied")

    claiming.walking_plan = walking_plan
    real_claim = store.claim

    def claim(*a: Any, **k: Any) -> Any:
        mark("claim")
        rows = real_claim(*a, **k)
        if rows:
            mark("claimed")
        return rows

    store.claim = claim
    relay = Relay(RelayConfig.from_settings(concurrency=args.concurrency))
    bell = relay._bell
    real_ring, real_wait = bell.ring, bell.wait

    def ring() -> None:
        mark("rung")
        real_ring()

    def wait(timeout: float) -> bool:
        rung = real_wait(timeout)
        mark("woke")
        return rung

    bell.ring = ring  # type: ignore[method-assign]
    bell.wait = wait  # type: ignore[method-assign]
    worker = threading.Thread(target=relay.run, daemon=True)
    worker.start()
    time.sleep(2)  # the listener connected
    sql = _insert_sql(True, keyed=False, idempotent=False, notify=True, schedule="now", headers=False)
    at: dict[str, list[float]] = {s: [] for s in STAGES}
    own: dict[str, list[float]] = {s: [] for s in STAGES}
    with psycopg.connect(os.environ["DATABASE_URL"]) as sender:
        for n in range(args.messages):
            sender.execute(sql, [uuid.uuid4(), TOPIC, f'{{"n": {n}}}', 5, "django_outbox"])
            came.clear()
            time.sleep(0.002)  # the worker's last wake-up settled
            marks.clear()
            sender.commit()
            returned = now()
            came.wait(5)
            time.sleep(0.003)
            seen = dict(marks)
            # A stage the path skipped (the claim without the walking plan has no pipeline) is left out;
            # the listener may hear the NOTIFY before the sender hears COMMIT's reply (a negative time).
            if "handler" in seen:
                previous = returned
                for s in STAGES:
                    if s in seen:
                        at[s].append((seen[s] - returned) * 1000)
                        own[s].append((seen[s] - previous) * 1000)
                        previous = seen[s]
            time.sleep(random.uniform(0.005, 0.015))
    relay.stop()
    worker.join(timeout=10)
    count = len(at["handler"])
    print(f"{count} of {args.messages} messages reached the handler; times after COMMIT returned (ms)")
    print(f"{'stage':<10} {'at p50':>8} {'at p90':>8} {'own p50':>8} {'own p90':>8} {'count':>6}")
    for s in STAGES:
        if len(at[s]) < 10:
            continue
        qa, qo = statistics.quantiles(at[s], n=10), statistics.quantiles(own[s], n=10)
        print(
            f"{s:<10} {statistics.median(at[s]):8.3f} {qa[8]:8.3f} {statistics.median(own[s]):8.3f}"
            f" {qo[8]:8.3f} {len(at[s]):6d}"
        )
    total = at["handler"]
    if len(total) >= 100:
        q = statistics.quantiles(total, n=100)
        print(f"COMMIT's return to handler: p50 {statistics.median(total):.3f} / p90 {q[89]:.3f} / p99 {q[98]:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
