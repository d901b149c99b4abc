"""bench/run.py's MariaDB section: the drain and send() on MariaDB, each beside its hand-written floor.

The database is ``MARIADB_URL`` (default :data:`DEFAULT_URL`), a database of the benchmark's own: it is
created if needed, migrated and emptied as the section goes. The harness process stays on PostgreSQL's
settings; everything that runs Django on MariaDB is a child process with ``DATABASE_URL`` pointing there.

- Drain: ``manage.py outbox_worker --batch-size 100 --poll-interval 0.01`` processes (two delivery
  threads each, the default on MariaDB as on PostgreSQL; at one process also ``--concurrency 1``) beside the same
  number of hand-written relays (``bench/mariadb_relay.py``: the two-statement claim) on the minimal twin
  table (``reference``) and on the project's own table (``same_table``), every system once per repetition
  in an order rotated by one, each draining a backlog of N committed at once. The workers' poll interval
  is 10 ms (the least the option accepts; the relays sleep 5 ms when idle), so none waits out a 1 s poll.
- send(): ``bench/mariadb_send.py`` run as a child process (its own interleaving; a one-row business
  transaction plus ``send()`` against the same plus one hand-written ``INSERT`` of the row).
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

from . import procs
from .mariadb_relay import FILL, SOURCE, TABLE, connect, create_twin

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "mysql://root@127.0.0.1:3306/bench_outbox_mariadb"
#: The workers' longest idle sleep, the least the option takes (the relays sleep 5 ms): polling does not dominate.
POLL_INTERVAL = "0.01"
Json = dict[str, Any]


def url() -> str:
    return os.environ.get("MARIADB_URL") or DEFAULT_URL


def reachable(dsn: str) -> bool:
    """Whether the server of ``dsn`` accepts a connection (the database itself need not exist yet)."""
    import MySQLdb

    parsed = urlparse(dsn)
    try:
        MySQLdb.connect(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 3306,
            user=parsed.username or "root",
            password=parsed.password or "",
            connect_timeout=3,
        ).close()
    except MySQLdb.Error:
        return False
    return True


def _django_env(dsn: str) -> dict[str, str]:
    return {"DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": dsn}


def prepare(dsn: str) -> str:
    """Create and migrate the database (through ``bench/mariadb_send.py``'s own helper); the server's version."""
    from .mariadb_send import ensure_database

    ensure_database(dsn)
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env={**os.environ, **_django_env(dsn)},
        check=True,
    )
    conn = connect(dsn, autocommit=True)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT VERSION()")
        version = str(cursor.fetchone()[0])
        create_twin(conn)
    finally:
        conn.close()
    return version


@dataclass(frozen=True)
class System:
    name: str
    table: str
    ready_line: str
    options: tuple[str, ...] = ()

    def start(self, dsn: str) -> procs.Proc:
        if self.ready_line == "relaying":
            return procs.outbox_worker(dsn, "--batch-size", "100", "--poll-interval", POLL_INTERVAL, *self.options)
        return procs.Proc([sys.executable, str(ROOT / "bench" / "mariadb_relay.py"), dsn, "--table", self.table])


#: The worker as ``manage.py outbox_worker`` runs it: two delivery threads (its default there), two
#: connections against the relay's one.
OUTBOX = System("outbox", SOURCE, "relaying")
#: At one process also with one delivery thread, one connection like the relay's.
OUTBOX_ONE_THREAD = System("outbox_one_thread", SOURCE, "relaying", ("--concurrency", "1"))
REFERENCE = System("reference", TABLE, "ready")
SAME_TABLE = System("same_table", SOURCE, "ready")


def _reset(cursor: Any, system: System) -> None:
    if system.table == SOURCE:
        for table in (SOURCE, "django_outbox_attempt", "django_outbox_worker", "django_outbox_key_lock"):
            cursor.execute(f"TRUNCATE {table}")
    else:
        cursor.execute(f"TRUNCATE {system.table}")


def drain_once(dsn: str, system: System, processes: int, n: int) -> float:
    """Messages per second for ``processes`` idle workers to drain a backlog of ``n`` committed at once."""
    conn = connect(dsn, autocommit=True)
    try:
        cursor = conn.cursor()
        _reset(cursor, system)
        started = [system.start(dsn) for _ in range(processes)]
        try:
            for p in started:
                p.wait_for_line(system.ready_line)
            time.sleep(0.5)  # let them settle into their idle wait
            cursor.execute(FILL.format(table=system.table, n=n))  # autocommit: committed at once
            t0 = time.time()
            busy = f"SELECT EXISTS (SELECT 1 FROM {system.table} WHERE status IN ('pending', 'processing'))"
            deadline = time.monotonic() + 120 + n / 100
            while True:
                cursor.execute(busy)
                if not cursor.fetchone()[0]:
                    break
                for p in started:
                    if not p.alive():
                        raise RuntimeError(f"{system.name} worker died:\n" + "\n".join(p.lines[-30:]))
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"{system.name} did not drain {n}:\n" + "\n".join(started[0].lines[-30:]))
                time.sleep(0.01)
            t1 = time.time()
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
    from .figures import median

    result: Json = {"messages": messages, "batch_size": 100, "poll_interval_s": float(POLL_INTERVAL)}
    by: Json = {}
    for count in processes:
        systems = [OUTBOX, REFERENCE, SAME_TABLE] + ([OUTBOX_ONE_THREAD] if count == 1 else [])
        rounds: list[dict[str, float]] = []
        for rep in range(reps):
            order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
            rates = {s.name: drain_once(dsn, s, count, messages) for s in order}
            rounds.append(rates)
            log(f"  mariadb drain x{count}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
        ratio = median([r["outbox"] / r["reference"] for r in rounds])
        figure: Json = {
            "outbox_per_s": median([r["outbox"] for r in rounds]),
            "reference_per_s": median([r["reference"] for r in rounds]),
            "same_table_per_s": median([r["same_table"] for r in rounds]),
            "ratio": ratio,
            "ratio_same_table": median([r["outbox"] / r["same_table"] for r in rounds]),
            "same_table_to_reference": median([r["same_table"] / r["reference"] for r in rounds]),
            "target": ">= 0.5x the hand-written two-statement relay (aim 0.8x)",
            "ok": ratio >= 0.5,
            "reps": rounds,
        }
        if count == 1:
            figure["one_thread_per_s"] = median([r[OUTBOX_ONE_THREAD.name] for r in rounds])
            figure["ratio_one_thread"] = median([r[OUTBOX_ONE_THREAD.name] / r["reference"] for r in rounds])
        by[str(count)] = figure
    result["by_processes"] = by
    return result


def send(dsn: str, *, transactions: int, reps: int, log: Any) -> Json:
    """``bench/mariadb_send.py``'s figure, from a child process on MariaDB's settings."""
    from .figures import median

    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "send.json"
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "bench" / "mariadb_send.py"),
                "--transactions",
                str(transactions),
                "--reps",
                str(reps),
                "--output",
                str(output),
            ],
            cwd=ROOT,
            env={**os.environ, **_django_env(dsn)},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError("bench/mariadb_send.py failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
        for line in proc.stdout.splitlines():
            if line.startswith("  rep"):
                log("  mariadb send" + line[1:])
        figure: Json = json.loads(output.read_text())
    for kind in ("plain", "send", "floor", "send_keyed", "floor_keyed"):
        figure[f"{kind}_us_per_tx"] = median([r[kind] for r in figure["reps"]])
    figure["target"] = "<= 1.1x the hand-written INSERT floor"
    figure["ok"] = figure["send_vs_floor"] <= 1.1
    return figure


def measure(dsn: str, *, messages: int, processes: tuple[int, ...], reps: int, transactions: int, log: Any) -> Json:
    version = prepare(dsn)
    log(f"  {version}, database {urlparse(dsn).path.lstrip('/')!r}")
    return {
        "server": version,
        "drain": drain(dsn, messages=messages, processes=processes, reps=reps, log=log),
        "send": send(dsn, transactions=transactions, reps=reps, log=log),
    }
