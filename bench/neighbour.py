"""A busy neighbour: another database of the same server running tiny write transactions without pause.

    python bench/neighbour.py DSN

Each holds an xid for a moment, which anything that waits for the transactions running when it looked (the
keyed commit-order fence) waits for too. Prints ``ready`` and then, on SIGTERM, ``transactions <n>``.
"""

import signal
import sys

import psycopg

stopping: list[int] = []
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
done = 0
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS bench_neighbour (id bigserial PRIMARY KEY, v int NOT NULL)")
    conn.execute("TRUNCATE bench_neighbour")
    print("ready", flush=True)
    while not stopping:
        conn.execute("INSERT INTO bench_neighbour (v) VALUES (1)")
        done += 1
print(f"transactions {done}", flush=True)
