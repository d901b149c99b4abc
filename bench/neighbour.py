"""A busy neighbour: another database of the same server running tiny write transactions without pause.

    python bench/neighbour.py postgres://postgres@127.0.0.1:5432/bench_outbox_neighbour

What a second application (or a test suite) on the same PostgreSQL server does to the outbox: each of
its transactions holds an xid for a moment, so anything that waits for "every transaction that was
running when I looked" (the keyed commit-order fence) waits for it too. Prints ``ready`` and then, on
SIGTERM, ``transactions <n>``.
"""

from __future__ import annotations

import signal
import sys

import psycopg


def main() -> None:
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    done = 0
    with psycopg.connect(sys.argv[1], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_neighbour (id bigserial PRIMARY KEY, v int NOT NULL)")
        conn.execute("TRUNCATE bench_neighbour")
        print("ready", flush=True)
        while not stopping:
            conn.execute("INSERT INTO bench_neighbour (v) VALUES (1)")
            done += 1
    print(f"transactions {done}", flush=True)


if __name__ == "__main__":
    main()
