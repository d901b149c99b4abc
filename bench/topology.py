"""Commit-to-handler latency and drain throughput per deployment topology, each beside its reference.

Topologies (docs/deploying.md): direct; a private PgBouncer in session pooling; in transaction pooling
with ``LISTEN_DATABASE`` direct, and without (the worker polls every 5 s, the default, as every worker
here: only a wake-up explains a delivery within milliseconds); Django's own pool. **latency**: ``send()``'s
row and NOTIFY committed over the web process's path, to an idle worker's handler; reference: a bare NOTIFY
over the same path, heard where the listener is, and the direct topology. **drain**: a backlog committed at
once, from the first claim (and from the commit), beside direct in the same round. **prepared**: behind
transaction pooling, the adaptive fallback against ``PREPARED_STATEMENTS = False``. Every drain checks
each message was delivered once and counts log lines that would mean a pooler artefact taken for an outage.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import psycopg  # noqa: E402

from bench import common, figures, procs, tables  # noqa: E402
from bench.common import Json, interleaved, median, medians, parser, write_json  # noqa: E402

#: The product's default (conf.py); the workers here run with it so that polling cannot pass for a wake-up.
POLL = 5.0
#: Log lines of a worker that would mean a pooler artefact treated as an outage or a lost outcome.
TROUBLE = ("unavailable", "could not record")
#: What must not happen, counted in each repetition and summed.
COUNTS = ("lost", "duplicates", "not_once", "trouble_lines", "fallback_logged")
#: How long the listener's probe takes to call a deaf connection deaf (worker.listener.PROBE_TIMEOUT) and a margin.
SETTLE_SECONDS = 2.5
#: The row and the wake-up that send() writes (store.insert), in one statement; the harness needs no Django.
SEND = (
    "WITH m AS (INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status,"
    " attempts, max_attempts, available_at, created_at, last_error)"
    " VALUES (gen_random_uuid(), 'bench.latency', NULL, %s::jsonb, '{\"bench-latency\": \"1\"}', NULL, 'pending',"
    " 0, 5, now(), now(), '') RETURNING id) SELECT m.id, pg_notify('django_outbox', '') FROM m"
)


class Sizes(NamedTuple):
    reps: int
    latency_messages: int
    polling_messages: int
    drain_messages: int
    drain_processes: tuple[int, ...]


SIZES = {
    "full": Sizes(5, 200, 40, 20_000, (1, 2)),
    "quick": Sizes(3, 100, 20, 20_000, (1, 2)),
    "smoke": Sizes(1, 5, 2, 200, (1,)),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where the workers and the senders connect, and where a listener can hear a NOTIFY (None: nowhere)."""

    name: str
    label: str
    dsn: str
    listen_dsn: str | None
    env: dict[str, str] = dataclasses.field(default_factory=dict)


def topologies(dsn: str, session: str, transaction: str) -> list[Topology]:
    pool = {"BENCH_DB_OPTIONS": json.dumps({"pool": {"min_size": 1, "max_size": 4, "timeout": 10}})}
    listen = {"BENCH_LISTEN_DATABASE_URL": dsn}
    polling = f"PgBouncer, transaction pooling, no LISTEN_DATABASE (polls every {POLL:g}s)"
    return [
        Topology("direct", "direct connections", dsn, dsn),
        Topology("session", "PgBouncer, session pooling", session, session),
        Topology(
            "transaction_listen", "PgBouncer, transaction pooling, LISTEN_DATABASE direct", transaction, dsn, listen
        ),
        Topology("transaction_polling", polling, transaction, None),
        Topology("django_pool", 'Django\'s pool (OPTIONS["pool"])', dsn, dsn, pool),
    ]


log = functools.partial(print, flush=True)


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A client connection that prepares nothing: PgBouncer 1.18 in transaction pooling would lose them."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None)


def start_worker(t: Topology, **env: str) -> procs.Proc:
    env |= {**t.env, "BENCH_POLL_INTERVAL": str(POLL), "BENCH_LOG_LEVEL": "WARNING"}
    worker = procs.outbox_worker(t.dsn, "--batch-size", "100", env=env)
    worker.wait_for_line("relaying")
    return worker


def trouble(workers: list[procs.Proc]) -> int:
    return sum(1 for p in workers for line in p.lines if any(word in line for word in TROUBLE))


def compared(s: Sizes, paths: list[Topology], one: Callable[[Topology], Json], ratio: str, *keys: str) -> Json:
    """``one(path)`` for every path, ``s.reps`` times, the paths in alternating order so that each
    repetition of a path is in the same round as the reference's (the first path). Per path: the medians
    of ``keys``; ``ratio``, the median of each repetition's first key over the reference's; the counts of
    what must not happen, summed."""
    runs: dict[str, list[Json]] = {t.name: [] for t in paths}
    for first in interleaved(s.reps):
        for t in paths if first else paths[::-1]:
            runs[t.name].append(one(t))
    result: Json = {}
    for t in paths:
        r, reference = runs[t.name], runs[paths[0].name]
        result[t.name] = {
            "label": t.label,
            **medians(r, keys),
            ratio: median([x[keys[0]] / y[keys[0]] for x, y in zip(r, reference, strict=True)]),
            **{k: sum(x[k] for x in r) for k in COUNTS if k in r[0]},
            "reps": r,
        }
    return result


def send_each(dsn: str, n: int, statement: str, params: Callable[[int], list[Any]], gap: Any, arrived: Json) -> Json:
    """``n`` transactions over ``dsn``, each committing ``statement`` (its first column: the id that
    ``arrived`` times), a random ``gap`` apart; from each commit to its arrival."""
    committed: dict[str, float] = {}
    with connect(dsn) as sender:
        for i in range(n):
            with sender.transaction():
                row = sender.execute(statement, params(i)).fetchone()
                assert row is not None
                committed[str(row[0])] = time.time()  # before COMMIT: the figure includes the commit
            time.sleep(random.uniform(*gap))
    procs.wait_for_all(arrived, committed, POLL * 2 + 5)
    return figures.latency_summary([(arrived[k] - committed[k]) * 1000 for k in committed if k in arrived], n)


def notify(t: Topology, listen_dsn: str, n: int) -> Json:
    """The physical limit of a wake-up on ``t``: a bare NOTIFY over the sender's path, heard where the
    worker's listener LISTENs."""
    channel = f"bench_topology_{os.getpid()}"
    heard: dict[str, float] = {}
    done = threading.Event()
    with connect(listen_dsn) as listening:
        listening.execute(f"LISTEN {channel}")

        def listen() -> None:
            while not done.is_set():
                for note in listening.notifies(timeout=0.2):
                    heard[note.payload] = time.time()

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        try:
            statement = "SELECT %s, pg_notify(%s, %s)"
            return send_each(t.dsn, n, statement, lambda i: [str(i), channel, str(i)], figures.GAP, heard)
        finally:
            done.set()
            thread.join()


def latency(s: Sizes, paths: list[Topology]) -> Json:
    """Each path's commit-to-handler latency on a fresh idle worker (a gap spread over the poll interval
    when it polls), and beside it a bare NOTIFY's (except where nothing can hear one)."""

    def once(t: Topology) -> Json:
        with tables.connect(paths[0].dsn) as conn:
            tables.truncate(conn)
        worker = start_worker(t, BENCH_UDP_PORT=str(port))
        try:
            time.sleep(SETTLE_SECONDS)  # the listener's probe is over: idle, as in production
            arrived.clear()
            n, gap = (s.latency_messages, figures.GAP) if t.listen_dsn else (s.polling_messages, (0.05, POLL / 4))
            rep = send_each(t.dsn, n, SEND, lambda i: [json.dumps({"n": i})], gap, arrived)
        finally:
            worker.stop()
        rep |= {"lost": rep["sent"] - rep["received"], "trouble_lines": trouble([worker])}
        if t.listen_dsn:  # nothing can hear a NOTIFY behind transaction pooling
            rep["notify_p50_ms"] = notify(t, t.listen_dsn, s.latency_messages)["p50_ms"]
        log(f"  latency {t.label}: p50 {rep['p50_ms']:.1f} p95 {rep['p95_ms']:.1f} ms")
        return rep

    with procs.udp_receiver() as (port, arrived):
        result = compared(s, paths, once, "p50_ratio_to_direct", "p50_ms", "p95_ms", "p99_ms")
    for r in result.values():
        if "notify_p50_ms" in r["reps"][0]:
            r["notify_p50_ms"] = median([x["notify_p50_ms"] for x in r["reps"]])
            r["p50_ratio_to_notify"] = median([x["p50_ms"] / x["notify_p50_ms"] for x in r["reps"]])
    return result


def drain_once(t: Topology, dsn: str, processes: int, n: int) -> Json:
    """``processes`` idle workers on ``t`` drain ``n`` messages committed at once (direct)."""
    with tables.connect(dsn) as conn:
        tables.truncate(conn)
    started = [start_worker(t) for _ in range(processes)]
    try:
        time.sleep(SETTLE_SECONDS)
        with tables.connect(dsn) as conn:
            t0 = tables.fill_pending(conn, n, analyze=True)
            first: list[float] = []

            def done() -> bool:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status <> 'pending'),"
                    " count(*) FILTER (WHERE status IN ('pending', 'processing')) FROM django_outbox_message"
                ).fetchone()
                assert row is not None
                if not first and row[0]:
                    first.append(time.time())
                return not row[1]

            t1 = procs.wait_drained(done, started, f"{t.name} draining {n}", 120 + n / 50)
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'delivered' AND attempts = 1),"
                " (SELECT count(*) FROM django_outbox_attempt) FROM django_outbox_message"
            ).fetchone()
            assert row is not None
    finally:
        procs.stop_all(started)
    rep = {
        "per_s": n / max(t1 - first[0], 1e-3),
        "wake_s": first[0] - t0,
        "duplicates": int(str(row[1])) - n,
        "not_once": n - int(str(row[0])),
        "trouble_lines": trouble(started),
        "fallback_logged": sum(1 for p in started for line in p.lines if "prepared statements do not survive" in line),
    }
    log(f"  drain {t.label} x{processes}: {rep['per_s']:,.0f} msg/s")
    return rep


def drain(s: Sizes, dsn: str, paths: list[Topology]) -> Json:
    """Each path's rate per process count, beside the first path's in the same round."""
    by: Json = {}
    for p in s.drain_processes:
        once = functools.partial(drain_once, dsn=dsn, processes=p, n=s.drain_messages)
        by[str(p)] = compared(s, paths, once, "ratio", "per_s", "wake_s")
    return {"messages": s.drain_messages, "by_processes": by}


def main() -> int:
    args_parser = parser(__doc__)
    mode = args_parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer messages: about ten minutes")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (CI); figures mean nothing")
    args_parser.add_argument("--output", type=Path, required=True, help="JSON file")
    args = args_parser.parse_args()
    dsn = os.environ["DATABASE_URL"]
    from tests.support import pgbouncer  # needs /usr/sbin/pgbouncer (apt-get install pgbouncer)

    common.setup_django("default")
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    s = SIZES[size_name]
    url = urlparse(dsn)
    # Fewer server connections than clients in transaction pooling, as in production.
    session, transaction = (
        pgbouncer.PgBouncer(mode, server_host=url.hostname or "127.0.0.1", server_port=url.port or 5432, pool_size=size)
        for mode, size in (("session", 30), ("transaction", 4))
    )
    results: Json = {"mode": size_name, "environment": figures.environment(dsn), "figures": {}}
    started = time.monotonic()
    try:
        paths = topologies(dsn, session.url(url.path[1:]), transaction.url(url.path[1:]))
        log("latency, idle worker ...")
        results["figures"]["latency"] = latency(s, paths)
        log("drain ...")
        results["figures"]["drain"] = drain(s, dsn, paths)
        log("prepared statements behind transaction pooling ...")
        adaptive = paths[2]
        env = {**adaptive.env, "BENCH_PREPARED_STATEMENTS": "0"}
        label = adaptive.label + ", PREPARED_STATEMENTS = False"
        unprepared = dataclasses.replace(adaptive, name=adaptive.name + "_unprepared", label=label, env=env)
        results["figures"]["prepared"] = drain(s, dsn, [adaptive, unprepared])
    finally:
        session.stop()
        transaction.stop()
    results["environment"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["seconds"] = time.monotonic() - started
    write_json(args.output, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
