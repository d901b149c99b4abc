"""Commit-to-handler latency and drain throughput per deployment topology, each beside its reference.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_outbox python bench/topology.py [--quick | --smoke]
        [--output FILE]

Topologies (docs/deploying.md): direct; a private PgBouncer (started here) in session pooling; in
transaction pooling with ``LISTEN_DATABASE`` direct, and without (the worker polls, every 5 s: the
default); Django's own pool. Workers run with the default poll interval, so only a wake-up explains a
delivery within milliseconds. **latency**: ``send()``'s row and NOTIFY committed over the web process's
path, to an idle worker's handler; reference: a bare NOTIFY over the same path to a LISTEN where the
listener is, and the direct topology. **drain**: a backlog committed at once, counted from the first
claim (and from the commit), beside direct in the same round. **prepared**: behind transaction pooling,
the adaptive fallback against ``PREPARED_STATEMENTS = False``. Every drain checks each message was
delivered once and counts log lines that would mean a pooler artefact taken for an outage.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import psycopg  # noqa: E402

from bench import common, figures, procs, tables  # noqa: E402
from bench.common import Json, interleaved, markdown, median, medians, parser, write_json  # noqa: E402
from bench.figures import latency_summary  # noqa: E402

#: The product's default (conf.py); the workers here run with it so that polling cannot pass for a wake-up.
DEFAULT_POLL_INTERVAL = 5.0
#: Log lines of a worker that would mean a pooler artefact treated as an outage or a lost outcome.
TROUBLE = ("unavailable", "could not record")
#: How long the listener's probe takes to call a deaf connection deaf (worker.listener.PROBE_TIMEOUT) and a margin.
SETTLE_SECONDS = 2.5
DJANGO_POOL = {"pool": {"min_size": 1, "max_size": 4, "timeout": 10}}


@dataclass(frozen=True, kw_only=True)
class Sizes:
    reps: int
    latency_messages: int
    polling_messages: int
    drain_messages: int
    drain_processes: tuple[int, ...]


SIZES = {
    "full": Sizes(reps=5, latency_messages=200, polling_messages=40, drain_messages=20_000, drain_processes=(1, 2)),
    "quick": Sizes(reps=3, latency_messages=100, polling_messages=20, drain_messages=20_000, drain_processes=(1, 2)),
    "smoke": Sizes(reps=1, latency_messages=5, polling_messages=2, drain_messages=200, drain_processes=(1,)),
}


@dataclass(frozen=True)
class Topology:
    """Where the workers and the senders connect, and where a listener can hear a NOTIFY (None: nowhere)."""

    name: str
    label: str
    dsn: str
    listen_dsn: str | None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def polls(self) -> bool:
        return self.listen_dsn is None


def topologies(dsn: str, session: Any, transaction: Any) -> list[Topology]:
    name = urlparse(dsn).path.lstrip("/")
    session_url, transaction_url = session.url(name), transaction.url(name)
    no_listen = f"PgBouncer, transaction pooling, no LISTEN_DATABASE (polls every {DEFAULT_POLL_INTERVAL:g}s)"
    return [
        Topology("direct", "direct connections", dsn, dsn),
        Topology("session", "PgBouncer, session pooling", session_url, session_url),
        Topology(
            "transaction_listen",
            "PgBouncer, transaction pooling, LISTEN_DATABASE direct",
            transaction_url,
            dsn,
            {"BENCH_LISTEN_DATABASE_URL": dsn},
        ),
        Topology("transaction_polling", no_listen, transaction_url, None),
        Topology(
            "django_pool", 'Django\'s pool (OPTIONS["pool"])', dsn, dsn, {"BENCH_DB_OPTIONS": json.dumps(DJANGO_POOL)}
        ),
    ]


def unprepared(t: Topology) -> Topology:
    """``t`` with ``OUTBOX["PREPARED_STATEMENTS"] = False`` from the start."""
    label, env = t.label + ", PREPARED_STATEMENTS = False", {**t.env, "BENCH_PREPARED_STATEMENTS": "0"}
    return dataclasses.replace(t, name=t.name + "_unprepared", label=label, env=env)


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A client connection that prepares nothing: PgBouncer 1.18 in transaction pooling would lose them."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=None)


def start_worker(t: Topology, *extra: str, udp_port: int | None = None) -> procs.Proc:
    env = {**t.env, "BENCH_POLL_INTERVAL": str(DEFAULT_POLL_INTERVAL), "BENCH_LOG_LEVEL": "WARNING"}
    if udp_port is not None:
        env["BENCH_UDP_PORT"] = str(udp_port)
    return procs.outbox_worker(t.dsn, "--batch-size", "100", *extra, env=env)


def trouble(lines: list[str]) -> int:
    return sum(1 for line in lines if any(word in line for word in TROUBLE))


# --- latency --------------------------------------------------------------------------------------


#: The row and the wake-up that send() writes (store.insert), in one statement; the harness needs no Django.
SEND = (
    "WITH m AS (INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status,"
    " attempts, max_attempts, available_at, created_at, last_error)"
    " VALUES (gen_random_uuid(), 'bench.latency', NULL, %s::jsonb, '{\"bench-latency\": \"1\"}', NULL, 'pending',"
    " 0, 5, now(), now(), '') RETURNING id) SELECT m.id, pg_notify('django_outbox', '') FROM m"
)


def gap(t: Topology) -> float:
    """The pause between two commits: short for wake-ups; spread over the poll interval for polling."""
    return random.uniform(0.05, DEFAULT_POLL_INTERVAL / 4) if t.polls else random.uniform(0.005, 0.015)


def latency_once(ctx: Context, t: Topology, udp_port: int, arrived: dict[str, float]) -> Json:
    """One repetition: a fresh idle worker on ``t``, messages one per transaction, commit to handler."""
    worker = start_worker(t, udp_port=udp_port)
    try:
        worker.wait_for_line("relaying")
        time.sleep(SETTLE_SECONDS)  # the listener's probe is over: idle, as in production
        arrived.clear()
        committed: dict[str, float] = {}
        n = ctx.sizes.polling_messages if t.polls else ctx.sizes.latency_messages
        with connect(t.dsn) as sender:
            for i in range(n):
                with sender.transaction():
                    row = sender.execute(SEND, [json.dumps({"n": i})]).fetchone()
                    assert row is not None
                    committed[str(row[0])] = time.time()  # before COMMIT: the figure includes the commit
                time.sleep(gap(t))
        procs.wait_for_all(arrived, committed, DEFAULT_POLL_INTERVAL * 2 + 5)
        ms = [(arrived[k] - committed[k]) * 1000 for k in committed if k in arrived]
    finally:
        worker.stop()
    return {**latency_summary(ms, len(committed)), "trouble_lines": trouble(worker.lines)}


def notify_once(ctx: Context, t: Topology) -> Json | None:
    """The physical limit of a wake-up on ``t``: a bare NOTIFY committed over the sender's path, heard
    where the worker's listener LISTENs. None where nothing can hear one (transaction pooling)."""
    if t.listen_dsn is None:
        return None
    channel = f"bench_topology_{os.getpid()}"
    heard: dict[str, float] = {}
    with connect(t.listen_dsn) as listening:
        listening.execute(f"LISTEN {channel}")
        done = threading.Event()

        def listen() -> None:
            while not done.is_set():
                for note in listening.notifies(timeout=0.2):
                    heard[note.payload] = time.time()

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        sent: dict[str, float] = {}
        try:
            with connect(t.dsn) as sender:
                for i in range(ctx.sizes.latency_messages):
                    with sender.transaction():
                        sender.execute("SELECT pg_notify(%s, %s)", [channel, str(i)])
                        sent[str(i)] = time.time()
                    time.sleep(random.uniform(*figures.GAP))
            procs.wait_for_all(heard, sent, 5)
        finally:
            done.set()
            thread.join()
    return latency_summary([(heard[k] - sent[k]) * 1000 for k in sent if k in heard], len(sent))


def latency(ctx: Context, paths: list[Topology]) -> Json:
    """Each topology's latency and NOTIFY round trip per repetition, topologies in alternating order."""
    reps: dict[str, list[Json]] = {t.name: [] for t in paths}
    limits: dict[str, list[Json]] = {t.name: [] for t in paths}
    with procs.udp_receiver() as (port, arrived):
        for first in interleaved(ctx.sizes.reps):
            for t in paths if first else paths[::-1]:
                with tables.connect(ctx.dsn) as conn:
                    tables.truncate(conn)
                rep = latency_once(ctx, t, port, arrived)
                reps[t.name].append(rep)
                limit = notify_once(ctx, t)
                if limit is not None:
                    limits[t.name].append(limit)
                ctx.log(
                    f"  latency {t.name}: p50 {rep['p50_ms']:.1f} p95 {rep['p95_ms']:.1f} p99 {rep['p99_ms']:.1f} ms"
                    + (f"; NOTIFY alone p50 {limit['p50_ms']:.2f} ms" if limit else "")
                )
    result: Json = {}
    direct = reps[paths[0].name]
    for t in paths:
        r = reps[t.name]
        figure: Json = {
            "label": t.label,
            "polls": t.polls,
            "poll_interval_s": DEFAULT_POLL_INTERVAL,
            "messages_per_rep": ctx.sizes.polling_messages if t.polls else ctx.sizes.latency_messages,
            **medians(r, ("p50_ms", "p95_ms", "p99_ms")),
            "lost": sum(x["sent"] - x["received"] for x in r),
            "trouble_lines": sum(x["trouble_lines"] for x in r),
            # per repetition against the direct topology's repetition of the same round
            "p50_ratio_to_direct": median([x["p50_ms"] / d["p50_ms"] for x, d in zip(r, direct, strict=True)]),
            "reps": r,
        }
        if limits[t.name]:
            lim = limits[t.name]
            figure["notify_p50_ms"] = median([x["p50_ms"] for x in lim])
            figure["notify_p99_ms"] = median([x["p99_ms"] for x in lim])
            figure["notify_reps"] = lim
            figure["p50_ratio_to_notify"] = median([x["p50_ms"] / n["p50_ms"] for x, n in zip(r, lim, strict=True)])
        result[t.name] = figure
    return result


# --- drain ----------------------------------------------------------------------------------------


def drain_once(ctx: Context, t: Topology, processes: int, n: int) -> Json:
    """``processes`` idle workers on ``t`` drain ``n`` messages committed at once (direct)."""
    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)
    started = [start_worker(t) for _ in range(processes)]
    try:
        for p in started:
            p.wait_for_line("relaying")
        time.sleep(SETTLE_SECONDS)
        with tables.connect(ctx.dsn) as conn:
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
    return {
        "per_s": n / max(t1 - first[0], 1e-3),
        "per_s_from_commit": n / (t1 - t0),
        "wake_s": first[0] - t0,
        "delivered_once": int(str(row[0])),
        "attempts": int(str(row[1])),
        "trouble_lines": sum(trouble(p.lines) for p in started),
        "fallback_logged": sum(1 for p in started for line in p.lines if "prepared statements do not survive" in line),
    }


def drain(ctx: Context, paths: list[Topology], reference: Topology) -> Json:
    """Each path's rate per process count, beside ``reference`` in the same round, rounds alternating."""
    n = ctx.sizes.drain_messages
    result: Json = {}
    for processes in ctx.sizes.drain_processes:
        reps: dict[str, list[Json]] = {t.name: [] for t in [reference, *paths]}
        order = [reference, *(t for t in paths if t.name != reference.name)]
        for first in interleaved(ctx.sizes.reps):
            for t in order if first else order[::-1]:
                rep = drain_once(ctx, t, processes, n)
                reps[t.name].append(rep)
                ctx.log(
                    f"  drain {t.name} x{processes}: {rep['per_s']:,.0f}/s from the first claim,"
                    f" {rep['per_s_from_commit']:,.0f}/s from the commit"
                )
        by: Json = {}
        for t in order:
            r = reps[t.name]
            by[t.name] = {
                "label": t.label,
                **medians(r, ("per_s", "per_s_from_commit", "wake_s")),
                "ratio": median([x["per_s"] / ref["per_s"] for x, ref in zip(r, reps[reference.name], strict=True)]),
                "duplicates": sum(x["attempts"] - n for x in r),
                "not_once": sum(n - x["delivered_once"] for x in r),
                "trouble_lines": sum(x["trouble_lines"] for x in r),
                "fallback_logged": sum(x["fallback_logged"] for x in r),
                "reps": r,
            }
        result[str(processes)] = by
    return {"messages": n, "reference": reference.name, "by_processes": result}


# --- the harness ----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Context:
    dsn: str
    sizes: Sizes
    log: Callable[[str], None] = print


def main(argv: list[str] | None = None) -> int:
    args_parser = parser(__doc__)
    mode = args_parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer messages: about ten minutes")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (CI); figures mean nothing")
    args_parser.add_argument("--output", type=Path, help="JSON file (default bench/results/topology-<timestamp>.json)")
    args = args_parser.parse_args(argv)
    dsn = os.environ["DATABASE_URL"]
    if not dsn.startswith("postgres"):
        args_parser.error("DATABASE_URL must name a PostgreSQL database of the benchmark's own")
    from tests.support import pgbouncer

    if not pgbouncer.available():
        args_parser.error(f"PgBouncer is needed ({pgbouncer.BINARY}; apt-get install pgbouncer)")
    common.setup_django("default")
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    ctx = Context(dsn=dsn, sizes=SIZES[size_name], log=lambda s: print(s, flush=True))
    host, port = urlparse(dsn).hostname or "127.0.0.1", urlparse(dsn).port or 5432
    # Fewer server connections than clients in transaction pooling, as in production.
    session = pgbouncer.PgBouncer("session", server_host=host, server_port=port, pool_size=30)
    transaction = pgbouncer.PgBouncer("transaction", server_host=host, server_port=port, pool_size=4)
    results: Json = {"mode": size_name, "environment": figures.environment(dsn), "figures": {}}
    out: Json = results["figures"]
    started = time.monotonic()
    try:
        paths = topologies(dsn, session, transaction)
        print("latency, idle worker ...", flush=True)
        out["latency"] = latency(ctx, paths)
        print("drain ...", flush=True)
        out["drain"] = drain(ctx, paths, reference=paths[0])
        print("prepared statements behind transaction pooling ...", flush=True)
        adaptive = next(t for t in paths if t.name == "transaction_listen")
        out["prepared"] = drain(ctx, [unprepared(adaptive)], reference=adaptive)
    finally:
        session.stop()
        transaction.stop()
    results["environment"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["seconds"] = time.monotonic() - started
    output = args.output or ROOT / "bench" / "results" / f"topology-{dt.datetime.now():%Y%m%d-%H%M%S}-{size_name}.json"
    write_json(output, results)
    print()
    print(render(results))
    print(f"\nwrote {output}")
    return 0


def render(results: Json) -> str:
    """Markdown: per topology, the latency beside its NOTIFY limit, and the drain rates beside direct."""
    f = results["figures"]
    rows: list[tuple[str, ...]] = []
    for lat in f["latency"].values():
        limit = (
            f"{lat['notify_p50_ms']:.2f} / {lat['notify_p99_ms']:.2f} ms" if "notify_p50_ms" in lat else "none hears"
        )
        ms = f"{lat['p50_ms']:.1f} / {lat['p95_ms']:.1f} / {lat['p99_ms']:.1f} ms"
        rows.append((lat["label"], ms, limit, f"{lat['p50_ratio_to_direct']:.2f}x"))
    header: tuple[str, ...] = (
        "topology",
        "commit to handler p50 / p95 / p99",
        "NOTIFY alone p50 / p99 (same path)",
        "p50 vs direct",
    )
    tables_ = [markdown(header, rows)]
    for key in ("drain", "prepared"):
        rows = []
        for processes, by in f[key]["by_processes"].items():
            for d in by.values():
                rates = f"{d['per_s']:,.0f}", f"{d['per_s_from_commit']:,.0f}", f"{d['ratio']:.2f}x"
                rows.append((d["label"], processes, *rates, str(d["duplicates"])))
        header = (f"{key}: topology", "processes", "msg/s (first claim on)", "msg/s from commit", "ratio", "duplicates")
        tables_.append(markdown(header, rows))
    return "\n\n".join(tables_)


if __name__ == "__main__":
    sys.exit(main())
