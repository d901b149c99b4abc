"""bench/run.py's MariaDB section: the drain and send() on MariaDB, each beside its hand-written floor.

In ``MARIADB_URL`` (default :data:`DEFAULT_URL`), a database of the benchmark's own, created, migrated and
emptied. The harness stays on PostgreSQL's settings: what runs Django on MariaDB is a child process.

- Drain: ``outbox_worker --batch-size 100 --poll-interval 0.01`` processes (at one process also with
  ``--concurrency 1``) beside as many hand-written relays (``bench/mariadb_relay.py``, the two-statement
  claim) on the minimal twin table (``reference``) and on the project's own (``same_table``), every
  system once per repetition in a rotated order, each draining a backlog committed at once. 10 ms is the
  least poll interval the option takes (the relays sleep 5 ms), so no one waits out a 1 s poll.
- send(): ``bench/mariadb_send.py`` in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import common, procs, tables
from .common import ROOT, Json, median
from .mariadb_relay import FILL, SOURCE, TABLE, connect, create_twin

__all__ = ["DEFAULT_URL", "connect", "measure", "reachable", "url"]
DEFAULT_URL = "mysql://root@127.0.0.1:3306/bench_outbox_mariadb"
POLL_INTERVAL = "0.01"


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


@dataclass(frozen=True)
class System:
    name: str
    table: str
    ready_line: str
    options: tuple[str, ...] = ()

    def start(self, dsn: str) -> procs.Proc:
        if self.ready_line == "relaying":
            return procs.outbox_worker(dsn, "--batch-size", "100", "--poll-interval", POLL_INTERVAL, *self.options)
        return procs.script("mariadb_relay.py", dsn, "--table", self.table)


#: The worker as ``outbox_worker`` runs it: two delivery threads, two connections against the relay's one.
OUTBOX = System("outbox", SOURCE, "relaying")
OUTBOX_ONE_THREAD = System("outbox_one_thread", SOURCE, "relaying", ("--concurrency", "1"))
REFERENCE = System("reference", TABLE, "ready")
SAME_TABLE = System("same_table", SOURCE, "ready")


def drain_once(dsn: str, system: System, processes: int, n: int) -> float:
    """Messages per second for ``processes`` idle workers to drain a backlog of ``n`` committed at once."""
    conn = connect(dsn, autocommit=True)
    try:
        cursor = conn.cursor()
        if system.table == SOURCE:
            for table in (SOURCE, "django_outbox_attempt", "django_outbox_worker", "django_outbox_key_lock"):
                cursor.execute(f"TRUNCATE {table}")
        else:
            cursor.execute(f"TRUNCATE {system.table}")
        started = [system.start(dsn) for _ in range(processes)]
        try:
            for p in started:
                p.wait_for_line(system.ready_line)
            time.sleep(0.5)  # let them settle into their idle wait
            cursor.execute(FILL.format(table=system.table, n=n))  # autocommit: committed at once
            t0 = time.time()

            def done() -> bool:
                cursor.execute(
                    f"SELECT EXISTS (SELECT 1 FROM {system.table} WHERE status IN ('pending', 'processing'))"
                )
                return not cursor.fetchone()[0]

            t1 = procs.wait_drained(done, started, f"{system.name} draining {n}", 120 + n / 100)
            cursor.execute(f"SELECT COUNT(*) FROM {system.table} WHERE status = 'delivered'")
            delivered = int(cursor.fetchone()[0])
            if delivered != n:
                raise RuntimeError(f"{system.name}: {delivered} of {n} delivered")
        finally:
            procs.stop_all(started)
    finally:
        conn.close()
    return n / (t1 - t0)


def drain(dsn: str, *, messages: int, processes: tuple[int, ...], reps: int, log: Any) -> Json:
    by: Json = {}
    for count in processes:
        systems = [OUTBOX, REFERENCE, SAME_TABLE] + ([OUTBOX_ONE_THREAD] if count == 1 else [])
        rounds: list[Json] = []
        for rep in range(reps):
            rounds.append({s.name: drain_once(dsn, s, count, messages) for s in common.rotated(systems, rep)})
            log(f"  mariadb drain x{count}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rounds[-1].items()))
        ratio = common.ratio(rounds, "outbox", "reference")
        by[str(count)] = {
            **common.medians(rounds, ("outbox", "reference", "same_table"), "_per_s"),
            "ratio": ratio,
            "ratio_same_table": common.ratio(rounds, "outbox", "same_table"),
            "same_table_to_reference": common.ratio(rounds, "same_table", "reference"),
            "target": ">= 0.5x the hand-written two-statement relay (aim 0.8x)",
            "ok": ratio >= 0.5,
            "reps": rounds,
        }
        if count == 1:
            by["1"]["one_thread_per_s"] = median([r[OUTBOX_ONE_THREAD.name] for r in rounds])
            by["1"]["ratio_one_thread"] = common.ratio(rounds, OUTBOX_ONE_THREAD.name, "reference")
    return {"messages": messages, "batch_size": 100, "poll_interval_s": float(POLL_INTERVAL), "by_processes": by}


def send(dsn: str, *, transactions: int, reps: int, log: Any) -> Json:
    """``bench/mariadb_send.py``'s figure, from a child process on MariaDB's settings."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "send.json"
        args = ["--transactions", str(transactions), "--reps", str(reps), "--output", str(output)]
        proc = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "mariadb_send.py"), *args],
            cwd=ROOT,
            env={**os.environ, **common.django_env(dsn)},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError("bench/mariadb_send.py failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
        for line in proc.stdout.splitlines():
            if line.startswith("  rep"):
                log("  mariadb send" + line[1:])
        figure: Json = json.loads(output.read_text())
    figure |= common.medians(figure["reps"], ("plain", "send", "floor", "send_keyed", "floor_keyed"), "_us_per_tx")
    figure["target"] = "<= 1.1x the hand-written INSERT floor"
    figure["ok"] = figure["send_vs_floor"] <= 1.1
    return figure


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
