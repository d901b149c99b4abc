"""pgqueuer with a no-op entrypoint, for the drain comparison.

    python -m bench.compare.pgqueuer_app schema|fill N|worker     (BENCH_COMPARE_DSN must be set)

``worker`` runs ``PgQueuer.run()`` with the library's defaults (batches of 10, LISTEN/NOTIFY wake-ups)
and prints ``ready`` once connected; ``fill`` enqueues N jobs in one statement (one transaction) and
prints the time right after it committed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import psycopg
from pgqueuer import PgQueuer
from pgqueuer.db import PsycopgDriver, SyncPsycopgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries, SyncQueries

DSN = os.environ.get("BENCH_COMPARE_DSN", "")


async def schema() -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        row = await (await conn.execute("SELECT to_regclass('pgqueuer')")).fetchone()
        if row is None or row[0] is None:
            await Queries(PsycopgDriver(conn)).install()


async def worker() -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        pgq = PgQueuer(PsycopgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            """The no-op job."""

        print("ready", flush=True)
        await pgq.run()


def main() -> None:
    command = sys.argv[1]
    if command == "schema":
        asyncio.run(schema())
    elif command == "fill":
        n = int(sys.argv[2])
        with psycopg.connect(DSN, autocommit=True) as conn:
            SyncQueries(SyncPsycopgDriver(conn)).enqueue(["noop"] * n, [None] * n, [0] * n)
        print(repr(time.time()), flush=True)
    elif command == "worker":
        asyncio.run(worker())


if __name__ == "__main__":
    main()
