"""bench/run.py's MariaDB section: the drain and send() on MariaDB, each beside its hand-written floor, in a
database of its own at ``MARIADB_URL`` (a child process runs Django there: the harness stays on PostgreSQL).

Drain: ``outbox_worker --batch-size 100 --poll-interval 0.01`` (10 ms, the option's least: the relays sleep
5 ms) beside as many relays of bench/mariadb_relay.py on a twin table, in a rotated order, each draining a
backlog committed at once. send(): an order plus ``send``, ``floor`` (the same row by one hand-written
``INSERT``), ``send_keyed`` and ``floor_keyed`` (with a key; the floor writes the key's lock row first, as
per-key order needs on MariaDB) or ``plain`` (nothing), interleaved one transaction at a time.
"""

import json
import os
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common, procs, tables
from bench.common import Json
from bench.mariadb_relay import SOURCE, TABLE
from bench.tables import mysql as connect

DEFAULT_URL = "mysql://root@127.0.0.1:3306/bench_outbox_mariadb"
POLL_INTERVAL = "0.01"
MODES = ["plain", "send", "floor", "send_keyed", "floor_keyed"]
SYSTEMS = ["outbox", "reference"]
#: The send() figure's ratios (mode, reference).
RATIOS = [("send", "floor"), ("send_keyed", "floor_keyed")] + [(m, "plain") for m in ("send", "floor", "send_keyed")]
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
        connect(dsn, database=False, connect_timeout=3).close()
    except MySQLdb.Error:
        return False
    return True


def create_twin(cursor: Any) -> None:
    """The project's columns as they are now, with only the primary key and an index on ``(status, id)`` for
    the claim's ``ORDER BY`` (without one, InnoDB locks what it scans and a second relay gets nothing)."""
    cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")
    cursor.execute(f"CREATE TABLE {TABLE} LIKE {SOURCE}")
    cursor.execute(
        "SELECT DISTINCT index_name FROM information_schema.statistics"
        " WHERE table_schema = DATABASE() AND table_name = %s AND index_name <> 'PRIMARY'",
        [TABLE],
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f"ALTER TABLE {TABLE} DROP INDEX `{name}`")
    cursor.execute(f"CREATE INDEX {TABLE}_status_id ON {TABLE} (status, id)")


def drain_once(cursor: Any, dsn: str, system: str, processes: int, n: int) -> float:
    """Messages per second for ``processes`` idle workers to drain a backlog of ``n`` committed at once."""
    for each in (SOURCE, "django_outbox_attempt", "django_outbox_worker", "django_outbox_key_lock", TABLE):
        cursor.execute(f"TRUNCATE {each}")
    if system == "outbox":
        table, ready, options = SOURCE, "relaying", ("--batch-size", "100", "--poll-interval", POLL_INTERVAL)
        started = [procs.outbox_worker(dsn, *options) for _ in range(processes)]
    else:
        table, ready, started = TABLE, "ready", [procs.script("mariadb_relay.py", dsn) for _ in range(processes)]
    try:
        for p in started:
            p.wait_for_line(ready)
        time.sleep(0.5)  # let them settle into their idle wait
        cursor.execute(tables.fill_sql("mysql", n, table=table))  # autocommit: committed at once
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
    return n / (t1 - t0)


def send(transactions: int, reps: int) -> Json:
    """The send() figure, in the child process (on MariaDB's settings)."""
    from django_outbox import outbox

    def write(mode: str, i: int, order: Any) -> None:
        payload, key = common.order_payload(order), f"order-{i % 50}" if mode.endswith("keyed") else None
        if mode.startswith("send"):
            outbox.send("bench.noop", payload, key=key)
        elif mode.startswith("floor"):
            if key:
                common.execute(LOCK, [key])
            common.execute(FLOOR, [key, json.dumps(payload)])

    def run(n: int) -> dict[str, float]:
        for table in ("django_outbox_message", "django_outbox_key_lock", "shop_order"):
            common.sql(f"DELETE FROM {table}")
        return common.per_transaction(MODES, n, lambda m, i: common.business_transaction(i, lambda o: write(m, i, o)))

    run(max(50, transactions // 10))  # warm-up: connection, caches
    results: list[Json] = []
    for rep in range(reps):
        results.append(run(transactions))
        shown = ", ".join(f"{k} {v:.0f} µs" for k, v in results[-1].items())
        print(f"  mariadb send rep {rep + 1}: {shown}", flush=True)
    figure: Json = {"transactions_per_kind_per_rep": transactions, "reps": results}
    figure |= {f"{mode}_vs_{ref}": round(common.ratio(results, mode, ref), 3) for mode, ref in RATIOS}
    figure |= common.medians(results, MODES, "_us_per_tx")
    return figure | {"target": "<= 1.1x the hand-written INSERT floor", "ok": figure["send_vs_floor"] <= 1.1}


def measure(dsn: str, *, messages: int, processes: tuple[int, ...], reps: int, transactions: int, log: Any) -> Json:
    """Both figures; the drain's per process count, its rounds rotating which system goes first."""
    tables.ensure_database(dsn)
    common.manage(dsn, "migrate", "--verbosity", "0")
    by: Json = {}
    with closing(connect(dsn, autocommit=True)) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT VERSION()")
        version = str(cursor.fetchone()[0])
        log(f"  {version}, database {urlparse(dsn).path.lstrip('/')!r}")
        create_twin(cursor)
        for count in processes:
            rounds: list[Json] = []
            for rep in range(reps):
                rounds.append({s: drain_once(cursor, dsn, s, count, messages) for s in common.rotated(SYSTEMS, rep)})
                log(f"  mariadb drain x{count}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rounds[-1].items()))
            ratio = common.ratio(rounds, "outbox", "reference")
            by[str(count)] = common.medians(rounds, SYSTEMS, "_per_s") | {
                "ratio": ratio,
                "target": ">= 0.5x the hand-written two-statement relay (aim 0.8x)",
                "ok": ratio >= 0.5,
                "reps": rounds,
            }
    drain = {"messages": messages, "batch_size": 100, "poll_interval_s": float(POLL_INTERVAL), "by_processes": by}
    sent = common.child_json([__file__, str(transactions), str(reps)], env=common.django_env(dsn))
    return {"server": version, "drain": drain, "send": sent}


if __name__ == "__main__":  # the send() figure's child process, DATABASE_URL naming the MariaDB database
    parser = common.parser(__doc__)
    parser.add_argument("transactions", type=int, help="transactions of each kind per repetition")
    parser.add_argument("reps", type=int)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    common.setup_django("default")
    common.write_json(args.output, send(args.transactions, args.reps))
