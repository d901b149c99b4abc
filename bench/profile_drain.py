"""Where the worker's Python time goes: a drain of no-op messages in one thread, under cProfile.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_profile python bench/profile_drain.py [--messages 20000]
        [--top 40] [--no-profile]

It fills ``--messages`` pending messages, then drains them with ``Relay.drain()`` (the worker's own claim,
dispatch and record, in the calling thread) and prints the functions with the most own time, and the
CPU time per message with and without the profiler (``--no-profile``: only the timing, for an A/B of two
source trees on a machine where the profiler's own overhead would hide a few microseconds).
``DATABASE_URL=mysql://...`` profiles the same on MariaDB (a database of its own: created, migrated, emptied).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_profile")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench import tables  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    dsn = os.environ["DATABASE_URL"]
    mariadb = dsn.startswith("mysql")
    if mariadb:
        from bench.mariadb_send import ensure_database

        ensure_database(dsn)
    else:
        tables.ensure_database(dsn)

    import django

    django.setup()
    from django.core.management import call_command

    from django_outbox.worker import Relay, RelayConfig

    call_command("migrate", verbosity=0)
    for _ in range(args.reps):
        if mariadb:
            _fill_mariadb(args.messages)
        else:
            with tables.connect(dsn) as conn:
                tables.truncate(conn)
                tables.fill_pending(conn, args.messages, analyze=True)
        relay = Relay(RelayConfig.from_settings(batch_size=100, concurrency=1))
        profiler = None if args.no_profile else cProfile.Profile()
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        stats = relay.drain()
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"drained {stats.delivered:,} in {wall:.2f}s: {cpu / args.messages * 1e6:.1f} us of CPU per message"
            f" ({'under the profiler' if profiler else 'no profiler'}), {args.messages / wall:,.0f}/s",
            flush=True,
        )
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    return 0


def _fill_mariadb(n: int) -> None:
    from django.db import connection

    from bench.mariadb_relay import FILL

    with connection.cursor() as cursor:
        for table in ("django_outbox_message", "django_outbox_attempt", "django_outbox_worker"):
            cursor.execute(f"TRUNCATE {table}")
        cursor.execute(FILL.format(table="django_outbox_message", n=n))


if __name__ == "__main__":
    sys.exit(main())
