"""bench/run.py's MariaDB section: the drain and send() on MariaDB, each beside its hand-written floor.

In ``MARIADB_URL`` (default :data:`DEFAULT_URL`), a database of the benchmark's own, created, migrated and
emptied. The harness stays on PostgreSQL's settings: what runs Django on MariaDB is a child process
(``python -m bench.mariadb --send``).

- Drain: ``outbox_worker --batch-size 100 --poll-interval 0.01`` processes beside as many hand-written
  relays (``bench/mariadb_relay.py``, the two-statement claim) on the minimal twin table, each once per
  repetition in alternating order, each draining a backlog committed at once. 10 ms is the least poll
  interval the option takes (the relays sleep 5 ms), so no one waits out a 1 s poll.
- send(): each transaction is the business write (an order) plus ``send`` (``outbox.send()``), ``floor``
  (the same row by one hand-written ``INSERT`` into the project's table), ``send_keyed`` and
  ``floor_keyed`` (with a key, the floor then being the two statements per-key order needs on MariaDB:
  the key's lock row, then the row) or nothing (``plain``), interleaved one transaction at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench import common, procs, tables
from bench.common import ROOT, Json
from bench.mariadb_relay import FILL, SOURCE, TABLE, connect, create_twin

__all__ = ["DEFAULT_URL", "connect", "measure", "reachable", "url"]
DEFAULT_URL = "mysql://root@127.0.0.1:3306/bench_outbox_mariadb"
POLL_INTERVAL = "0.01"
SEND_MODES = ("plain", "send", "floor", "send_keyed", "floor_keyed")
FLOOR = (
    "INSERT INTO django_outbox_message (uuid, topic, `key`, payload, headers, idempotency_key, status, attempts,"
    " max_attempts, available_at, created_at, last_error) VALUES (REPLACE(UUID(), '-', ''), 'bench.noop', %s, %s,"
    " '{}', NULL, 'pending', 0, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), '')"
)
LOCK = "INSERT INTO django_outbox_key_lock (`key`) VALUES (%s) ON DUPLICATE KEY UPDATE `key` = `key`"


def url() -> str:
    return os.environ.get("MARIADB_URL") or DEFAULT_URL


def reachable(dsn: str) -> bool:
    """Whether the server of ``dsn`` accepts a connection (the database itself need not exist yet)."""
    import MySQLdb

    try:
        tables.mysql(dsn, database=False, connect_timeout=3).close()
    except MySQLdb.Error:
        return False
    return True


def drain_once(dsn: str, system: str, processes: int, n: int) -> float:
    """Messages per second for ``processes`` idle ``system`` processes to drain ``n`` committed at once."""
    table = SOURCE if system == "outbox" else TABLE
    conn = connect(dsn, autocommit=True)
    try:
        cursor = conn.cursor()
        for name in (SOURCE, "django_outbox_attempt", "django_outbox_worker", "django_outbox_key_lock", TABLE):
            cursor.execute(f"TRUNCATE {name}")
        if system == "outbox":
            args, ready = ["--batch-size", "100", "--poll-interval", POLL_INTERVAL], "relaying"
            started = [procs.outbox_worker(dsn, *args) for _ in range(processes)]
        else:
            started, ready = [procs.script("mariadb_relay.py", dsn) for _ in range(processes)], "ready"
        try:
            for p in started:
                p.wait_for_line(ready)
            time.sleep(0.5)  # let them settle into their idle wait
            cursor.execute(FILL.format(table=table, n=n))  # autocommit: committed at once
            t0 = time.time()

            def done() -> bool:
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE status IN ('pending', 'processing'))")
                return not cursor.fetchone()[0]

            t1 = procs.wait_drained(done, started, f"{system} draining {n}", 120 + n / 100)
            cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE status = 'delivered'")
            if (delivered := int(cursor.fetchone()[0])) != n:
                raise RuntimeError(f"{system}: {delivered} of {n} delivered")
        finally:
            procs.stop_all(started)
    finally:
        conn.close()
    return n / (t1 - t0)


def drain(dsn: str, *, messages: int, processes: tuple[int, ...], reps: int, log: Any) -> Json:
    by: Json = {}
    for count in processes:
        rounds: list[Json] = []
        for rep in range(reps):
            order = common.rotated(["outbox", "reference"], rep)
            rounds.append({system: drain_once(dsn, system, count, messages) for system in order})
            log(f"  mariadb drain x{count}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rounds[-1].items()))
        by[str(count)] = {
            **common.medians(rounds, ("outbox", "reference"), "_per_s"),
            "ratio": common.ratio(rounds, "outbox", "reference"),
            "reps": rounds,
        }
    return {"messages": messages, "batch_size": 100, "by_processes": by}


def send(dsn: str, *, transactions: int, reps: int, log: Any) -> Json:
    """The send() figure, from a child process on MariaDB's settings (:func:`send_child`)."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "send.json"
        args = ["--send", str(output), "--transactions", str(transactions), "--reps", str(reps)]
        proc = subprocess.run(
            [sys.executable, "-m", "bench.mariadb", *args],
            cwd=ROOT,
            env={**os.environ, **common.django_env(dsn)},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError("the MariaDB send() child failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
        log(proc.stdout.rstrip())
        figure: Json = json.loads(output.read_text())
    figure |= common.medians(figure["reps"], SEND_MODES, "_us_per_tx")
    return figure


def send_child(transactions: int, reps: int) -> Json:
    """``send()`` against its floors on the database of ``DATABASE_URL`` (Django set up for it)."""
    common.setup_django("default")
    from django_outbox import outbox

    def write(mode: str, i: int, order: Any) -> None:
        payload, key = common.order_payload(order), f"order-{i % 50}"
        if mode.startswith("send"):
            outbox.send("bench.noop", payload, key=key if mode == "send_keyed" else None)
        elif mode.startswith("floor"):
            if mode == "floor_keyed":
                common.execute(LOCK, [key])
            common.execute(FLOOR, [key if mode == "floor_keyed" else None, json.dumps(payload)])

    def run(n: int) -> dict[str, float]:
        return common.per_transaction(
            SEND_MODES, n, lambda m, i: common.business_transaction(i, lambda o: write(m, i, o))
        )

    def empty() -> None:
        for table in ("django_outbox_message", "django_outbox_key_lock", "shop_order"):
            common.sql(f"DELETE FROM {table}")

    empty()
    run(max(50, transactions // 10))  # warm-up: connection, caches
    results: list[dict[str, float]] = []
    for rep in range(reps):
        empty()
        results.append(run(transactions))
        print(f"  mariadb send rep {rep + 1}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in results[-1].items()))
    empty()
    return {
        "transactions_per_kind_per_rep": transactions,
        "reps": results,
        "send_vs_floor": common.ratio(results, "send", "floor"),
        "send_keyed_vs_floor_keyed": common.ratio(results, "send_keyed", "floor_keyed"),
    }


def measure(dsn: str, *, messages: int, processes: tuple[int, ...], reps: int, transactions: int, log: Any) -> Json:
    tables.ensure_database(dsn)
    common.manage(dsn, "migrate", "--verbosity", "0")
    conn = connect(dsn, autocommit=True)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT VERSION()")
        version = str(cursor.fetchone()[0])
        create_twin(conn)
    finally:
        conn.close()
    log(f"  {version}, database {urlparse(dsn).path.lstrip('/')!r}")
    return {
        "server": version,
        "drain": drain(dsn, messages=messages, processes=processes, reps=reps, log=log),
        "send": send(dsn, transactions=transactions, reps=reps, log=log),
    }


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("--send", type=Path, required=True, help="the send() figure's JSON file")
    parser.add_argument("--transactions", type=int, default=1000, help="transactions of each kind per repetition")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    common.write_json(args.send, send_child(args.transactions, args.reps))
