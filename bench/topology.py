"""Commit-to-handler latency and drain throughput per deployment topology (docs/deploying.md), each beside
its reference: direct; PgBouncer in session pooling; in transaction pooling with ``LISTEN_DATABASE``
direct, and without (polling every 5 s, the default, as every worker here: only a wake-up explains a
delivery within milliseconds); Django's own pool. **latency**: ``send()``'s row and NOTIFY, committed over
the web process's path, to an idle worker's handler, beside a bare NOTIFY heard where the listener is.
**drain**: a backlog committed at once, from the first claim (and from the commit), beside direct in the
same round. **prepared**: behind transaction pooling, the adaptive fallback against
``PREPARED_STATEMENTS = False``. Every drain checks each message was delivered once and counts the log
lines that would mean a pooler artefact taken for an outage.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import psycopg  # noqa: E402

from bench import common, figures, procs, tables  # noqa: E402
from bench.common import Json, interleaved, median, medians, parser, ratio, write_json  # noqa: E402

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


class Topology(NamedTuple):
    """Where the workers and the senders connect, and where a listener can hear a NOTIFY (None: nowhere)."""

    name: str
    label: str
    dsn: str
    listen_dsn: str | None
    env: dict[str, str]


def topologies(dsn: str, session: str, transaction: str) -> list[Topology]:
    pool = {"BENCH_DB_OPTIONS": json.dumps({"pool": {"min_size": 1, "max_size": 4, "timeout": 10}})}
    listen = {"BENCH_LISTEN_DATABASE_URL": dsn}
    polling = f"PgBouncer, transaction pooling, no LISTEN_DATABASE (polls every {POLL:g}s)"
    return [
        Topology("direct", "direct connections", dsn, dsn, {}),
        Topology("session", "PgBouncer, session pooling", session, session, {}),
        Topology(
            "transaction_listen", "PgBouncer, transaction pooling, LISTEN_DATABASE direct", transaction, dsn, listen
        ),
        Topology("transaction_polling", polling, transaction, None, {}),
        Topology("django_pool", 'Django\'s pool (OPTIONS["pool"])', dsn, dsn, pool),
    ]


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A client connection that prepares nothing: PgBouncer 1.18 in transaction pooling would lose them."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None)


@contextmanager
def idle_workers(t: Topology, dsn: str, processes: int, **env: str) -> Iterator[list[procs.Proc]]:
    """``processes`` workers on ``t`` over an outbox emptied through ``dsn``, given the time their listener's
    probe takes: idle, as in production."""
    with tables.connect(dsn) as conn:
        tables.truncate(conn)
    env |= {**t.env, "BENCH_POLL_INTERVAL": str(POLL), "BENCH_LOG_LEVEL": "WARNING"}
    workers: list[procs.Proc] = []
    try:
        for _ in range(processes):
            workers.append(procs.outbox_worker(t.dsn, "--batch-size", "100", env=env))
            workers[-1].wait_for_line("relaying")
        time.sleep(SETTLE_SECONDS)
        yield workers
    finally:
        procs.stop_all(workers)


def logged(workers: list[procs.Proc], *words: str) -> int:
    return sum(1 for p in workers for line in p.lines if any(word in line for word in words))


def compared(s: Sizes, paths: list[Topology], one: Callable[[Topology], Json], ratio_key: str, *keys: str) -> Json:
    """``one(path)`` per path, ``s.reps`` times in alternating order, so that each repetition shares a round
    with the reference's (the first path): the medians of ``keys``, ``ratio_key`` (of the first key, within
    each round) and the counts of what must not happen, summed."""
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
            ratio_key: median([x[keys[0]] / y[keys[0]] for x, y in zip(r, reference, strict=True)]),
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
    """A wake-up's physical limit on ``t``: a bare NOTIFY over the sender's path, heard where the worker's
    listener LISTENs."""
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
        with idle_workers(t, paths[0].dsn, 1, BENCH_UDP_PORT=str(port)) as workers:
            arrived.clear()
            n, gap = (s.latency_messages, figures.GAP) if t.listen_dsn else (s.polling_messages, (0.05, POLL / 4))
            rep = send_each(t.dsn, n, SEND, lambda i: [json.dumps({"n": i})], gap, arrived)
        rep |= {"lost": rep["sent"] - rep["received"], "trouble_lines": logged(workers, *TROUBLE)}
        if t.listen_dsn:  # nothing can hear a NOTIFY behind transaction pooling
            rep["notify_p50_ms"] = notify(t, t.listen_dsn, s.latency_messages)["p50_ms"]
        print(f"  latency {t.label}: p50 {rep['p50_ms']:.1f} p95 {rep['p95_ms']:.1f} ms", flush=True)
        return rep

    with procs.udp_receiver() as (port, arrived):
        result = compared(s, paths, once, "p50_ratio_to_direct", "p50_ms", "p95_ms", "p99_ms")
    for r in result.values():
        if "notify_p50_ms" in r["reps"][0]:
            r |= medians(r["reps"], ["notify_p50_ms"])
            r["p50_ratio_to_notify"] = ratio(r["reps"], "p50_ms", "notify_p50_ms")
    return result


def drain_once(t: Topology, dsn: str, processes: int, n: int) -> Json:
    """``processes`` idle workers on ``t`` drain ``n`` messages committed at once (direct)."""
    with idle_workers(t, dsn, processes) as started, tables.connect(dsn) as conn:
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
    rep = {
        "per_s": n / max(t1 - first[0], 1e-3),
        "wake_s": first[0] - t0,
        "duplicates": int(str(row[1])) - n,
        "not_once": n - int(str(row[0])),
        "trouble_lines": logged(started, *TROUBLE),
        "fallback_logged": logged(started, "prepared statements do not survive"),
    }
    print(f"  drain {t.label} x{processes}: {rep['per_s']:,.0f} msg/s", flush=True)
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
    from tests.support.pgbouncer import PgBouncer  # needs /usr/sbin/pgbouncer (apt-get install pgbouncer)

    common.setup_django("default")
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    s = SIZES[size_name]
    url = urlparse(dsn)
    # Fewer server connections than clients in transaction pooling, as in production.
    session, transaction = (
        PgBouncer(mode, server_host=url.hostname or "127.0.0.1", server_port=url.port or 5432, pool_size=size)
        for mode, size in (("session", 30), ("transaction", 4))
    )
    results: Json = {"mode": size_name, "environment": figures.environment(dsn), "figures": {}}
    started = time.monotonic()
    try:
        paths = topologies(dsn, session.url(url.path[1:]), transaction.url(url.path[1:]))
        adaptive = paths[2]
        results["figures"]["latency"] = latency(s, paths)
        results["figures"]["drain"] = drain(s, dsn, paths)
        unprepared = adaptive._replace(
            name=adaptive.name + "_unprepared",
            label=adaptive.label + ", PREPARED_STATEMENTS = False",
            env={**adaptive.env, "BENCH_PREPARED_STATEMENTS": "0"},
        )
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
