"""procrastinate with a no-op task, for the drain comparison.

    python -m bench.compare.procrastinate_app schema|fill N     (BENCH_COMPARE_DSN must be set)

The worker is procrastinate's own CLI: ``procrastinate --app=bench.compare.procrastinate_app.app worker``.
``fill`` defers N jobs in one call (one transaction) and prints the time right after it returned.
"""

from __future__ import annotations

import os
import sys
import time

import procrastinate
import psycopg

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_COMPARE_DSN", "")))


@app.task(name="noop", queue="bench")
def noop(n: int) -> None:
    """The no-op job."""


def main() -> None:
    command = sys.argv[1]
    with app.open():
        if command == "schema":
            with psycopg.connect(os.environ["BENCH_COMPARE_DSN"]) as conn:
                exists = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            if exists is None or exists[0] is None:
                app.schema_manager.apply_schema()
        elif command == "fill":
            noop.batch_defer(*[{"n": i} for i in range(int(sys.argv[2]))])
            print(repr(time.time()), flush=True)


if __name__ == "__main__":
    main()
