"""procrastinate; its worker: ``python -m procrastinate --app=bench.compare.procrastinate_app.app worker``."""

import os
import sys
import time

import procrastinate
import psycopg

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_COMPARE_DSN", "")))


@app.task(name="noop", queue="bench")
def noop(n: int) -> None:
    """The no-op job."""


if __name__ == "__main__":
    with app.open():
        if sys.argv[1] == "migrate":
            with psycopg.connect(os.environ["BENCH_COMPARE_DSN"]) as conn:
                exists = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            if exists is None or exists[0] is None:
                app.schema_manager.apply_schema()
        else:
            noop.batch_defer(*[{"n": i} for i in range(int(sys.argv[2]))])  # one transaction
            print(repr(time.time()), flush=True)
