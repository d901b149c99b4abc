"""pgqueuer, and its worker (``worker``: ``PgQueuer.run()`` with the library's defaults, batches of 10 and
LISTEN/NOTIFY wake-ups, printing ``ready`` once connected); ``fill`` enqueues in one statement."""

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


async def main(command: str) -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        if command == "migrate":
            row = await (await conn.execute("SELECT to_regclass('pgqueuer')")).fetchone()
            if row is None or row[0] is None:
                await Queries(PsycopgDriver(conn)).install()
            return
        pgq = PgQueuer(PsycopgDriver(conn))

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            """The no-op job."""

        print("ready", flush=True)
        await pgq.run()


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        n = int(sys.argv[2])
        with psycopg.connect(DSN, autocommit=True) as conn:
            SyncQueries(SyncPsycopgDriver(conn)).enqueue(["noop"] * n, [None] * n, [0] * n)
        print(repr(time.time()), flush=True)
    else:
        asyncio.run(main(sys.argv[1]))
