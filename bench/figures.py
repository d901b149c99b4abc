"""Each figure of docs/performance.md, measured in the harness process (Django on ``bench.settings``)
beside its reference in the same run, their repetitions interleaved so that the shared machine's drift
hits both."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import psycopg

from . import procs, tables
from .common import (
    Json,
    business_transaction,
    execute,
    interleaved,
    median,
    medians,
    order_payload,
    per_transaction,
    percentile,
    rotated,
    sql,
)
from .common import ratio as _ratio
from .minimal_relay import CREATE as MINIMAL_CREATE
from .minimal_relay import FILL as MINIMAL_FILL
from .minimal_relay import INSERT_MANY, INSERT_ONE
from .minimal_relay import TABLE as MINIMAL_TABLE


@dataclass(kw_only=True)
class Sizes:
    """A run's sizes; the defaults are the full run's."""

    reps: int = 3
    send_transactions: int = 2000
    send_reps: int = 5
    drain_messages: int = 40_000
    drain_processes: tuple[int, ...] = (1, 2, 4)
    one_thread: bool = True  # also drain with ``--concurrency 1`` at one process
    latency_messages: int = 200
    history_small: int = 10_000
    history_large: int = 1_000_000
    claim_batches: int = 50
    open_tx_seconds: float = 60
    memory_messages: int = 200_000
    compare_messages: int = 3000
    enqueue_transactions: int = 1600  # per round, split among the producers
    enqueue_producers: tuple[int, ...] = (1, 4, 16)
    mariadb_messages: int = 40_000  # bench/mariadb.py: backlog, process counts, send() transactions
    mariadb_processes: tuple[int, ...] = (1, 2)
    mariadb_transactions: int = 1000


SIZES = {
    "full": Sizes(),
    "quick": Sizes(
        send_transactions=150,
        drain_messages=5000,
        one_thread=False,
        history_large=200_000,
        claim_batches=20,
        open_tx_seconds=5,
        memory_messages=30_000,
        compare_messages=500,
        enqueue_transactions=800,
        mariadb_messages=10_000,
        mariadb_transactions=300,
    ),
    "smoke": Sizes(
        reps=1,
        send_transactions=20,
        send_reps=1,
        drain_messages=300,
        drain_processes=(1,),
        latency_messages=10,
        history_small=1000,
        history_large=2000,
        claim_batches=3,
        open_tx_seconds=1,
        memory_messages=500,
        compare_messages=50,
        enqueue_transactions=32,
        enqueue_producers=(1, 4),
        mariadb_messages=300,
        mariadb_processes=(1,),
        mariadb_transactions=20,
    ),
}


@dataclass(kw_only=True)
class Context:
    dsn: str
    sizes: Sizes
    compare_python: str | None = None
    log: Callable[[str], None] = print
    notes: list[str] = field(default_factory=list)
    minimal_made: bool = False

    @property
    def compare_dsn(self) -> str:
        parsed = urlparse(self.dsn)
        return parsed._replace(path=parsed.path + "_compare").geturl()


# --- a. send() overhead -----------------------------------------------------------------------

#: What a hand-written outbox would run: the same row and wake-up, one statement, no validation.
HAND_WRITTEN_SEND = (
    "WITH m AS (INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status,"
    " attempts, max_attempts, available_at, created_at, last_error)"
    " VALUES (gen_random_uuid(), 'bench.noop', NULL, %s::jsonb, '{}', NULL, 'pending', 0, 5, now(), now(), '')"
    " RETURNING id) SELECT pg_notify('django_outbox', '') FROM m"
)


def outbox_settings(**changes: Any) -> Any:
    from django.conf import settings
    from django.test import override_settings

    return override_settings(OUTBOX={**settings.OUTBOX, **changes})


def send_overhead(ctx: Context) -> Json:
    """Per-transaction times with and without ``send()``, the kinds interleaved one transaction at a time.

    The floor (``minimal``) is the same business transaction plus one hand-written ``INSERT`` of the row
    into the minimal twin table; beside it the row and NOTIFY by hand into the project's own table
    (``hand_written``) and a second business row through the ORM (``second_row``).
    """
    from django_outbox import outbox

    ensure_minimal(ctx)

    def write(mode: str, order: Any) -> None:
        payload = order_payload(order)
        if mode == "send":
            outbox.send("bench.noop", payload)
        elif mode == "minimal":
            execute(INSERT_ONE, [json.dumps(payload)])
        elif mode == "hand_written":
            execute(HAND_WRITTEN_SEND, [json.dumps(payload)])
        elif mode == "second_row":
            type(order).objects.create(customer_email="buyer@example.com", item="book", quantity=order.quantity)

    def run(modes: list[str]) -> dict[str, float]:
        one = lambda mode, i: business_transaction(i, lambda order: write(mode, order))  # noqa: E731
        return per_transaction(modes, ctx.sizes.send_transactions, one)

    modes = ["plain", "send", "minimal", "hand_written", "second_row"]
    run(modes)  # warm-up: connections, caches, plans
    reps: list[Json] = []
    for _ in range(ctx.sizes.send_reps):
        times = run(modes)
        with outbox_settings(NOTIFY=False):
            quiet = run(["plain", "send", "minimal"])
        times["plain_2"], times["send_no_notify"], times["minimal_2"] = quiet["plain"], quiet["send"], quiet["minimal"]
        reps.append(times)
        ctx.log("  send: " + ", ".join(f"{k} {v:.0f} µs" for k, v in times.items()))

    def added(reference: str) -> float:
        return median([(r["send"] - r["plain"]) / (r[reference] - r["plain"]) for r in reps])

    floor_ratio = _ratio(reps, "send", "minimal")
    kinds = ("plain", "send", "minimal", "hand_written", "second_row", "send_no_notify")
    return {
        "transactions": ctx.sizes.send_transactions,
        **medians(reps, kinds, "_us_per_tx"),
        "ratio": _ratio(reps, "send", "plain"),
        "ratio_minimal": _ratio(reps, "minimal", "plain"),
        "ratio_hand_written": _ratio(reps, "hand_written", "plain"),
        "ratio_second_row": _ratio(reps, "second_row", "plain"),
        "ratio_no_notify": _ratio(reps, "send_no_notify", "plain_2"),
        "ratio_to_floor": floor_ratio,  # the target's figure
        "ratio_to_floor_no_notify": _ratio(reps, "send_no_notify", "minimal_2"),
        # send()'s added cost over the minimal statement's added cost: 1.0 is the hand-written limit
        "added_cost_vs_minimal": added("minimal"),
        "added_cost_vs_hand_written": added("hand_written"),
        "target": "send <= 1.1x the floor (aim 1.05x)",
        "ok": floor_ratio <= 1.1,
        "reps": reps,
    }


def send_batch(ctx: Context) -> Json:
    """100 messages in one transaction (``send_many()``) against one; the floor writes its 100 rows with one
    ``INSERT ... SELECT unnest(...)``."""
    from django_outbox import outbox

    ensure_minimal(ctx)
    n = max(4, ctx.sizes.send_transactions // 5)

    def write(mode: str, order: Any) -> None:
        payloads = [{"order_id": order.pk, "item": order.item, "n": j} for j in range(100 if "100" in mode else 1)]
        if mode.startswith("send"):
            outbox.send_many([{"topic": "bench.noop", "payload": p} for p in payloads])
        elif len(payloads) == 1:
            execute(INSERT_ONE, [json.dumps(payloads[0])])
        else:
            execute(INSERT_MANY, [[json.dumps(p) for p in payloads]])

    modes = ["send_1", "send_100", "floor_1", "floor_100"]
    reps: list[Json] = []
    for rep in range(ctx.sizes.send_reps + 1):
        times = per_transaction(modes, n, lambda mode, i: business_transaction(i, lambda o: write(mode, o)))
        if rep:  # the first is the warm-up
            reps.append(times)
            ctx.log("  batch: " + ", ".join(f"{k} {v:.0f} µs" for k, v in times.items()))
    ratio = _ratio(reps, "send_100", "send_1")
    return {
        "api": "send_many",
        "transactions": n,
        **medians(reps, modes, "_us"),
        "ratio": ratio,
        "floor_ratio": _ratio(reps, "floor_100", "floor_1"),
        "ratio_100_to_floor_100": _ratio(reps, "send_100", "floor_100"),
        "target": "100 in one transaction <= 2x one",
        "ok": ratio <= 2.0,
        "reps": reps,
    }


def ensure_minimal(ctx: Context) -> None:
    """Create the minimal twin table once per run, from the project's table as it is now."""
    if not ctx.minimal_made:
        with tables.connect(ctx.dsn) as conn:
            for statement in MINIMAL_CREATE:
                conn.execute(statement)
        ctx.minimal_made = True


# --- b. drain throughput ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class System:
    """Something that drains a backlog: how to start one worker, see it ready, empty and fill its table."""

    name: str
    start: Callable[[Context], procs.Proc]
    ready: str | Callable[[Context, list[procs.Proc]], None]  # a line each worker prints, or a wait
    reset: tuple[str, ...]
    fill: Callable[[Context, int], float]
    busy: str  # whether anything is left to drain
    dsn: Callable[[Context], str] = lambda ctx: ctx.dsn  # where its table is
    seconds_per_message: float = 0.01  # how long it may take at most (and two minutes)


def _outbox_fill(ctx: Context, n: int) -> float:
    with tables.connect(ctx.dsn) as conn:
        return tables.fill_pending(conn, n, analyze=True)


def _minimal_fill(ctx: Context, n: int) -> float:
    """Like :func:`tables.fill_pending`: one transaction, analyzed before it commits, one NOTIFY."""
    with tables.connect(ctx.dsn) as conn:
        with conn.transaction():
            conn.execute(MINIMAL_FILL, {"n": n})
            conn.execute(f"ANALYZE {MINIMAL_TABLE}")
            conn.execute("SELECT pg_notify('bench_minimal', '')")
        return time.time()


def busy_sql(table: str, statuses: str) -> str:
    return f"SELECT EXISTS (SELECT 1 FROM {table} WHERE status IN ({statuses}))"


OUTBOX_RESET = (
    f"TRUNCATE {tables.MESSAGE}, {tables.ATTEMPT} RESTART IDENTITY CASCADE",
    "TRUNCATE django_outbox_worker",
)
OUTBOX_BUSY = busy_sql(tables.MESSAGE, "'pending', 'processing'")


def _outbox_system(name: str, *options: str) -> System:
    """``manage.py outbox_worker`` with batches of 100 and ``options``, on the outbox's own table."""
    return System(
        name=name,
        start=lambda ctx: procs.outbox_worker(ctx.dsn, "--batch-size", "100", *options),
        ready="relaying",
        reset=OUTBOX_RESET,
        fill=_outbox_fill,
        busy=OUTBOX_BUSY,
    )


OUTBOX = _outbox_system("outbox")
#: The outbox worker with one delivery thread: what one database connection of it drains.
OUTBOX_ONE_THREAD = _outbox_system("outbox_one_thread", "--concurrency", "1")
#: The hand-written relay on the project's own table (bench/baseline_relay.py).
BASELINE = System(
    name="baseline",
    start=lambda ctx: procs.script("baseline_relay.py", ctx.dsn),
    ready="ready",
    reset=OUTBOX_RESET,
    fill=_outbox_fill,
    busy=OUTBOX_BUSY,
)
#: The minimal reference: the hand-written relay on the minimal twin table (bench/minimal_relay.py).
MINIMAL = System(
    name="minimal",
    start=lambda ctx: procs.script("minimal_relay.py", ctx.dsn),
    ready="ready",
    reset=(f"TRUNCATE {MINIMAL_TABLE} RESTART IDENTITY",),
    fill=_minimal_fill,
    busy=busy_sql(MINIMAL_TABLE, "'pending', 'processing'"),
)


def _exists(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> bool:
    row = conn.execute(statement).fetchone()
    return bool(row and row[0])


def drain_once(ctx: Context, system: System, processes: int, n: int) -> float:
    """Messages per second for ``processes`` idle workers to drain a backlog of ``n`` committed at once."""
    dsn = system.dsn(ctx)
    with tables.connect(dsn) as conn:
        for statement in system.reset:
            conn.execute(statement)
    started = [system.start(ctx) for _ in range(processes)]
    try:
        if isinstance(system.ready, str):
            for p in started:
                p.wait_for_line(system.ready)
        else:
            system.ready(ctx, started)
        time.sleep(0.5)  # let them settle into their idle wait
        t0 = system.fill(ctx, n)
        with tables.connect(dsn) as poll:
            done = lambda: not _exists(poll, system.busy)  # noqa: E731
            timeout = 120 + n * system.seconds_per_message
            t1 = procs.wait_drained(done, started, f"{system.name} draining {n}", timeout)
    finally:
        procs.stop_all(started)
    return n / (t1 - t0)


def drain(ctx: Context) -> Json:
    """Each process count against both references with as many processes, every system once per repetition
    in an order rotated by one each time; the outbox with its defaults (two delivery threads per process)
    and, with ``one_thread``, at one process also with ``--concurrency 1``."""
    ensure_minimal(ctx)
    result: Json = {"messages": ctx.sizes.drain_messages, "batch_size": 100, "by_processes": {}}
    for processes in ctx.sizes.drain_processes:
        reps: list[Json] = []
        systems = [OUTBOX, BASELINE, MINIMAL]
        if processes == 1 and ctx.sizes.one_thread:
            systems.insert(1, OUTBOX_ONE_THREAD)
        for rep in range(ctx.sizes.reps):
            rates = {s.name: drain_once(ctx, s, processes, ctx.sizes.drain_messages) for s in rotated(systems, rep)}
            reps.append(rates)
            ctx.log(f"  drain x{processes}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
        ratio = _ratio(reps, "outbox", "minimal")
        figure: Json = {
            **medians(reps, ("outbox", "baseline", "minimal"), "_per_s"),
            "ratio": ratio,
            "ratio_same_table": _ratio(reps, "outbox", "baseline"),
            "same_table_to_minimal": _ratio(reps, "baseline", "minimal"),
            "target": ">= 0.5x the minimal reference (aim 0.8x)",
            "ok": ratio >= 0.5,
            "reps": reps,
        }
        if OUTBOX_ONE_THREAD.name in reps[0]:
            figure["one_thread_per_s"] = median([r[OUTBOX_ONE_THREAD.name] for r in reps])
            figure["ratio_one_thread"] = _ratio(reps, OUTBOX_ONE_THREAD.name, "minimal")
        result["by_processes"][str(processes)] = figure
    return result


# --- c. latency -------------------------------------------------------------------------------

#: Seconds between two sends, drawn at random.
GAP = (0.005, 0.015)


def latency_summary(ms: list[float], sent: int) -> Json:
    return {f"p{q}_ms": percentile(ms, q) for q in (50, 95, 99)} | {"received": len(ms), "sent": sent}


def latency(ctx: Context, *, database: str) -> Json:
    """Commit to handler start for messages sent one per transaction to an idle worker (SQLite: polling)."""
    from django.db import transaction

    from django_outbox import outbox

    poll_interval = "1.0"
    reps: list[Json] = []
    with procs.udp_receiver() as (port, arrived):
        env = {"BENCH_UDP_PORT": str(port), "BENCH_POLL_INTERVAL": poll_interval}
        worker = procs.outbox_worker(ctx.dsn, "--database", database, env=env)
        try:
            worker.wait_for_line("relaying")
            time.sleep(1.0)
            for _ in range(ctx.sizes.reps):
                arrived.clear()
                committed: dict[str, float] = {}
                for i in range(ctx.sizes.latency_messages):
                    with transaction.atomic(using=database):
                        message = outbox.send("bench.latency", {"n": i}, headers={"bench-latency": "1"}, using=database)
                        committed[str(message.id)] = time.time()  # before COMMIT: the figure includes it
                    time.sleep(random.uniform(*GAP))
                procs.wait_for_all(arrived, committed, 10)
                ms = [(arrived[k] - committed[k]) * 1000 for k in committed if k in arrived]
                reps.append(latency_summary(ms, len(committed)))
                ctx.log(f"  latency {database}: " + ", ".join(f"{k} {v:.1f}" for k, v in reps[-1].items()))
        finally:
            worker.stop()
    return {
        "database": database,
        "messages_per_rep": ctx.sizes.latency_messages,
        **medians(reps, ("p50_ms", "p95_ms", "p99_ms")),
        "lost": sum(r["sent"] - r["received"] for r in reps),
        "reps": reps,
        "poll_interval_s": float(poll_interval),
    }


def neighbour_dsn(ctx: Context) -> str:
    parsed = urlparse(ctx.dsn)
    return parsed._replace(path=parsed.path + "_neighbour").geturl()


#: The latency figure's messages, in turn: the outbox's keyed and unkeyed, and the minimal relay's rows.
LATENCY_KINDS = ("keyed", "unkeyed", "minimal")
#: Per kind and phase: commit to handler, then its split (COMMIT's own time, and from its return on).
LATENCY_FIGURES = (
    "p50_ms",
    "p99_ms",
    "max_ms",
    *(f"{s}_p{q}_ms" for s in ("commit", "after_commit") for q in (50, 99)),
)


def latency_neighbour(ctx: Context) -> Json:
    """Commit to handler, unkeyed and keyed, without and with a busy neighbour database on the same server.

    One idle worker (NOTIFY) and the minimal relay waiting for a NOTIFY of its own (the reference); each
    phase sends ``latency_messages`` one per transaction, in turn keyed (ten keys), unkeyed and a minimal
    row. In ``busy``, ``bench/neighbour.py`` runs tiny write transactions in ``<name>_neighbour``; the
    phases alternate their order. Figures: medians over the repetitions of each repetition's percentile.
    """
    from django.db import transaction

    from django_outbox import outbox

    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)
        tables.vacuum(conn)
    tables.ensure_database(neighbour_dsn(ctx))
    ensure_minimal(ctx)
    with tables.connect(ctx.dsn) as conn:
        conn.execute(MINIMAL.reset[0])

    def send(i: int, kind: str, flush: bool) -> str:
        with transaction.atomic():
            if not flush:  # this transaction only: COMMIT returns (and NOTIFY goes) before the WAL flush
                execute("SET LOCAL synchronous_commit = off")
            if kind == "minimal":  # the reference: one row into the minimal table, one NOTIFY
                row_id = f"m{sql(INSERT_ONE + ' RETURNING id', [json.dumps({'n': i})])[0][0]}"
                execute("SELECT pg_notify('bench_minimal', '')")
            else:
                key = f"k{i // len(LATENCY_KINDS) % 10}" if kind == "keyed" else None
                row_id = str(outbox.send("bench.latency", {"n": i}, key=key, headers={"bench-latency": "1"}).id)
            committed[row_id] = (time.time(), kind)  # before COMMIT: the figure includes it
        return row_id

    committed: dict[str, tuple[float, str]] = {}

    def phase(busy: bool, arrived: dict[str, float], *, flush: bool = True) -> Json:
        neighbour = procs.script("neighbour.py", neighbour_dsn(ctx)) if busy else None
        try:
            if neighbour is not None:
                neighbour.wait_for_line("ready")
                time.sleep(0.3)
            arrived.clear()
            committed.clear()
            returned: dict[str, float] = {}  # when COMMIT returned: the commit's own time is the difference
            for i in range(ctx.sizes.latency_messages):
                returned[send(i, LATENCY_KINDS[i % len(LATENCY_KINDS)], flush)] = time.time()
                time.sleep(random.uniform(*GAP))
            procs.wait_for_all(arrived, committed, 15)
        finally:
            if neighbour is not None:
                neighbour.stop()
        result: Json = {"lost": sum(1 for k in committed if k not in arrived)}
        if neighbour is not None:
            ran = [line for line in neighbour.lines if line.startswith("transactions ")]
            result["neighbour_transactions"] = int(ran[-1].split()[1]) if ran else 0
        for kind in LATENCY_KINDS:
            mine = [k for k, (_, sent) in committed.items() if sent == kind]
            ms = [(arrived[k] - committed[k][0]) * 1000 for k in mine if k in arrived]
            # the split: COMMIT's own round trip (the WAL flush), then from its return to the handler
            commit = [(returned[k] - committed[k][0]) * 1000 for k in mine]
            after = [(arrived[k] - returned[k]) * 1000 for k in mine if k in arrived]
            result[kind] = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms, default=0)}
            for name, values in (("commit", commit), ("after_commit", after)):
                result[kind] |= {f"{name}_p{q}_ms": percentile(values, q) for q in (50, 99)}
        return result

    reps: list[Json] = []
    with procs.udp_receiver() as (port, arrived):
        worker = procs.outbox_worker(ctx.dsn, env={"BENCH_UDP_PORT": str(port), "BENCH_POLL_INTERVAL": "1.0"})
        minimal = procs.script("minimal_relay.py", ctx.dsn, "--listen", "bench_minimal", "--udp-port", str(port))
        try:
            minimal.wait_for_line("ready")
            worker.wait_for_line("relaying")
            time.sleep(1.0)
            for first in interleaved(ctx.sizes.reps):
                rep = {("busy" if busy else "idle"): phase(busy, arrived) for busy in [not first, first]}
                # the idle phase with the senders' commits not waiting for the disk: the wake-up path alone
                rep["idle_async"] = phase(False, arrived, flush=False)
                reps.append(rep)
                ctx.log(
                    "  latency: "
                    + "; ".join(
                        f"{p} {k} p50 {rep[p][k]['p50_ms']:.1f} p99 {rep[p][k]['p99_ms']:.1f}"
                        for p in ("idle", "busy", "idle_async")
                        for k in LATENCY_KINDS
                    )
                )
        finally:
            worker.stop()
            minimal.stop()
    out: Json = {"messages_per_phase": ctx.sizes.latency_messages, "reps": reps}
    for p in ("idle", "busy", "idle_async"):
        fig: Json = {"lost": sum(r[p]["lost"] for r in reps)}
        for k in LATENCY_KINDS:
            fig[k] = {q: median([r[p][k][q] for r in reps]) for q in LATENCY_FIGURES}

        def within(kind: str, reference: str, q: str, p: str = p) -> float:
            return median([_safe_ratio(r[p][kind][q], r[p][reference][q]) for r in reps])

        fig["unkeyed_p50_to_minimal"] = within("unkeyed", "minimal", "p50_ms")
        fig["keyed_p50_ratio"] = within("keyed", "unkeyed", "p50_ms")
        fig["keyed_p99_ratio"] = within("keyed", "unkeyed", "p99_ms")
        out[p] = fig
    idle, busy = out["idle"], out["busy"]
    out["target"] = "idle p50 <= 2 ms, p99 <= 5 ms; busy keyed p50 <= 2x, p99 <= 3x unkeyed"
    out["ok_idle"] = idle["unkeyed"]["p50_ms"] <= 2 and idle["unkeyed"]["p99_ms"] <= 5
    out["ok_keyed"] = busy["keyed_p50_ratio"] <= 2 and busy["keyed_p99_ratio"] <= 3
    out["ok"] = out["ok_idle"] and out["ok_keyed"] and idle["lost"] + busy["lost"] == 0
    return out


def _safe_ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("nan")


# --- c. enqueue concurrency and keyed producers ---------------------------------------------------

ENQUEUE_MODES = ("send", "floor_notify", "send_quiet", "floor")
KEYED_MODES = ("send_quiet", "key_many", "key_one")


def _producer_rounds(ctx: Context, producers: int, per: int, modes: tuple[str, ...]) -> list[Json]:
    """Per repetition, transactions per second of each of ``modes``, their order reversed every other
    repetition: ``producers`` processes of ``bench/producer.py`` started once, each running ``per``
    transactions a round, each round released to all at once by a file (start-up is not timed)."""
    plan = [m for first in interleaved(ctx.sizes.reps) for m in (modes if first else modes[::-1])]
    rounds: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-producers-") as go_dir:
        env = {"DATABASE_URL": ctx.dsn}
        started = [procs.script("producer.py", go_dir, str(per), *plan, env=env) for _ in range(producers)]
        try:
            for p in started:
                p.wait_for_line("ready", timeout=180)
            for number, mode in enumerate(plan):
                t0 = time.monotonic()
                open(os.path.join(go_dir, f"go-{number}"), "w").close()
                for p in started:
                    p.wait_for_line(f"done {number} ", timeout=300)
                rounds.append((mode, producers * per / (time.monotonic() - t0)))
        finally:
            procs.stop_all(started)
    return [dict(rounds[i : i + len(modes)]) for i in range(0, len(rounds), len(modes))]


def _producers(ctx: Context, modes: tuple[str, ...], **ratios: tuple[str, str]) -> Json:
    """Each producer count's median rate per mode and the named ratios (the minimal table is the floor's,
    and the producers' warm-up writes to it)."""
    ensure_minimal(ctx)
    by: Json = {}
    for producers in ctx.sizes.enqueue_producers:
        per = max(4, ctx.sizes.enqueue_transactions // producers)
        reps = _producer_rounds(ctx, producers, per, modes)
        by[str(producers)] = figure = {
            "transactions_per_producer": per,
            **medians(reps, modes, "_per_s"),
            **{name: _ratio(reps, mode, reference) for name, (mode, reference) in ratios.items()},
            "reps": reps,
        }
        ctx.log(
            f"  producers x{producers}: "
            + ", ".join(f"{m} {figure[m + '_per_s']:,.0f} tx/s" for m in modes)
            + "; "
            + ", ".join(f"{name} {figure[name]:.2f}x" for name in ratios)
        )
    return {"by_producers": by}


def enqueue(ctx: Context) -> Json:
    """Transactions per second of 1, 4 and 16 producers: send() against the floor (the same transaction plus
    one hand-written INSERT into the minimal table), with NOTIFY (and pg_notify) and without."""
    result = _producers(
        ctx,
        ENQUEUE_MODES,
        ratio_notify=("send", "floor_notify"),
        ratio_quiet=("send_quiet", "floor"),
        notify_cost=("floor_notify", "floor"),
    )
    for figure in result["by_producers"].values():
        figure["ok"] = figure["ratio_notify"] >= 0.9 and figure["ratio_quiet"] >= 0.9
    result["target"] = "send >= 0.9x the floor at the same concurrency"
    result["ok"] = all(f["ok"] for f in result["by_producers"].values())
    return result


def keyed_producers(ctx: Context) -> Json:
    """Keyed ``send()`` against unkeyed, NOTIFY off: ``key_many`` a key per transaction (the locks' cost),
    ``key_one`` every producer on one key (they queue for its lock). Rounds as in ``enqueue``."""
    return _producers(
        ctx, KEYED_MODES, ratio_key_many=("key_many", "send_quiet"), ratio_key_one=("key_one", "send_quiet")
    )


# --- d. scale ---------------------------------------------------------------------------------


def claim_cost(ctx: Context) -> Json:
    """Milliseconds per claim (and per record) of 100 messages, with little and with much history, each in
    units of a primary-key lookup of 100 rows on the same connection; each batch alternating prepared
    statements (the default) and ``PREPARED_STATEMENTS = False``."""
    from django.db import connections

    per_size: Json = {}
    batches = ctx.sizes.claim_batches
    aliases = ("prepared", "unprepared")
    for label, history in (("small", ctx.sizes.history_small), ("large", ctx.sizes.history_large)):
        with tables.connect(ctx.dsn) as conn:
            tables.truncate(conn)
            ctx.log(f"  filling {history:,} rows of history ...")
            tables.fill_history(conn, history)
            conn.execute(tables.PENDING, {"n": 100 * (batches * ctx.sizes.reps + 6) * len(aliases)})
            tables.vacuum(conn)
            # Write the fill's pages out now, not while the claims are timed (the large size's only).
            conn.execute("CHECKPOINT")
        record_errors: dict[str, str] = {}
        connections["default"].close()
        for alias in aliases:
            for _ in range(6):  # warm-up: connection, catalog caches, the prepared statements
                _claim_and_record(alias, record_errors)
        reps: list[Json] = []
        for _ in range(ctx.sizes.reps):
            times: dict[str, list[float]] = {f"{kind}_{alias}": [] for kind in ("claim", "record") for alias in aliases}
            times["reference"] = []
            for i in range(batches):
                if i % 2 == 1:
                    times["reference"].append(_reference_lookup(history) * 1000)
                for alias in aliases if i % 2 == 0 else aliases[::-1]:
                    claim_s, record_s = _claim_and_record(alias, record_errors)
                    times[f"claim_{alias}"].append(claim_s * 1000)
                    if record_s is not None:
                        times[f"record_{alias}"].append(record_s * 1000)
                if i % 2 == 0:
                    times["reference"].append(_reference_lookup(history) * 1000)
            rep = {k: median(v) for k, v in times.items() if v}
            rep["claim_over_reference"] = rep["claim_prepared"] / rep["reference"]
            reps.append(rep)
        figure: Json = {"history_rows": history, **{k: median([r[k] for r in reps if k in r]) for k in reps[0]}}
        figure |= {"reps": reps, "claim_ms": figure["claim_prepared"], "reference_ms": figure["reference"]}
        figure["record_ms"] = figure["record_prepared"]
        if record_errors:
            figure["record_errors"] = record_errors
        per_size[label] = figure
        ctx.log(f"  with {history:,} rows of history: " + ", ".join(f"{k} {v:.2f} ms" for k, v in reps[-1].items()))
    small, large = per_size["small"], per_size["large"]
    ratio = large["claim_over_reference"] / small["claim_over_reference"]  # the target's figure
    return {
        **per_size,
        "ratio": ratio,
        "raw_ratio": large["claim_ms"] / small["claim_ms"],
        "reference_ratio": large["reference_ms"] / small["reference_ms"],
        "record_ratio": large["record_ms"] / small["record_ms"],
        "reference": "SELECT of 100 random history rows by primary key (id = ANY(...)), same connection",
        "target": "claim / reference within 10% from the small to the large history",
        "ok": ratio <= 1.10,
    }


def _reference_lookup(history: int) -> float:
    """Seconds of the reference statement: 100 rows of history fetched by primary key, one statement."""
    from django.db import connections

    ids = random.sample(range(1, history + 1), min(100, history))
    with connections["default"].cursor() as cursor:
        started = time.perf_counter()
        cursor.execute(
            "SELECT id, uuid, topic, key, payload, headers, attempts FROM django_outbox_message WHERE id = ANY(%s)",
            [ids],
        )
        cursor.fetchall()
        return time.perf_counter() - started


def _claim_and_record(mode: str, errors: dict[str, str]) -> tuple[float, float | None]:
    """Times of one claim of 100 and of recording them, with prepared statements on or off (``mode``)."""
    from django.db import DatabaseError
    from django.utils import timezone

    from django_outbox import store

    with outbox_settings(PREPARED_STATEMENTS=mode == "prepared"):
        t = time.perf_counter()
        batch = store.claim("default", worker=f"bench:{mode}", limit=100, lease_seconds=60)
        claim_s = time.perf_counter() - t
        now = timezone.now()
        outcomes = [
            store.Outcome(message_id=m.id, number=m.attempts, status=store.DELIVERED, started_at=now, finished_at=now)
            for m in batch
        ]
        t = time.perf_counter()
        try:
            store.record("default", worker=f"bench:{mode}", outcomes=outcomes)
        except DatabaseError as exc:  # reported as a finding
            errors[mode] = str(exc).strip()
            return claim_s, None
        return claim_s, time.perf_counter() - t


def open_transaction(ctx: Context, *, expected_rate: float) -> Json:
    """One worker's rate while another session holds a transaction (with an xid) open from before the
    backlog's commit to the window's end, against none; the backlog lasts about the window at b's rate."""
    window = ctx.sizes.open_tx_seconds
    backlog = int(min(400_000, max(1000, expected_rate * window)))

    def once(hold: bool) -> float:
        with tables.connect(ctx.dsn) as conn:
            tables.truncate(conn)
        holder = psycopg.connect(ctx.dsn) if hold else None
        worker = OUTBOX.start(ctx)
        try:
            worker.wait_for_line("relaying")
            time.sleep(0.5)
            if holder is not None:
                holder.execute("SELECT txid_current()")  # an xid: vacuum cannot remove what it might see
            t0 = _outbox_fill(ctx, backlog)
            with tables.connect(ctx.dsn) as conn:
                while time.time() < t0 + window and _exists(conn, OUTBOX_BUSY):
                    time.sleep(0.1)
                elapsed = time.time() - t0
                delivered = tables.count(conn, "delivered")
        finally:
            worker.stop()
            if holder is not None:
                holder.rollback()
                holder.close()
        return delivered / elapsed

    reps: list[Json] = []
    for first in interleaved(ctx.sizes.reps):
        reps.append({("held" if hold else "free"): once(hold) for hold in [first, not first]})
        ctx.log(f"  open transaction ({window:.0f}s): " + ", ".join(f"{k} {v:,.0f}/s" for k, v in reps[-1].items()))
    ratio = _ratio(reps, "held", "free")
    return {
        "window_s": window,
        "backlog": backlog,
        **medians(reps, ("free", "held"), "_per_s"),
        "ratio": ratio,
        "drop_percent": (1 - ratio) * 100,
        "reps": reps,
    }


# --- e. memory --------------------------------------------------------------------------------


def memory(ctx: Context) -> Json:
    """RSS of one worker over the relaying of a large backlog, sampled at each progress line."""
    n = ctx.sizes.memory_messages
    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)
        ctx.log(f"  filling {n:,} pending messages ...")
        for start in range(0, n, 100_000):
            conn.execute(tables.PENDING, {"n": min(100_000, n - start)})
        tables.vacuum(conn)
    # unbuffered: its progress lines (every 2 s) are read as they come, not all at its exit
    worker = procs.outbox_worker(ctx.dsn, "--until-empty", "--batch-size", "100", env={"PYTHONUNBUFFERED": "1"})
    samples: list[tuple[float, int, int]] = []  # (seconds, delivered so far, RSS KiB)
    t0 = time.monotonic()
    delivered = 0
    try:
        while worker.alive():
            progress = [line for line in worker.lines[-5:] if line.startswith("delivered ")]
            if progress:
                delivered = int(progress[-1].split()[1])
            try:
                rss = worker.rss_kib()
            except FileNotFoundError:  # it has just exited
                break
            if not rss:  # exited but not yet reaped: /proc has no VmRSS line
                break
            samples.append((time.monotonic() - t0, delivered, rss))
            time.sleep(0.25)
    finally:
        code = worker.stop()
    if code != 0:
        raise RuntimeError("memory run: worker failed:\n" + "\n".join(worker.lines[-30:]))
    # after a tenth of the messages; a drain too short for a progress line by then: after a fifth of its time
    warm = [s for s in samples if s[1] >= n * 0.1] or [s for s in samples if s[0] >= samples[-1][0] / 5] or samples
    after_warm = warm[0][2] if warm else 0
    final = samples[-1][2] if samples else 0

    def rate(start: float, end: float) -> float:
        inside = [x for x in samples if n * start <= x[1] <= n * end]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    every = max(1, n // 20)
    by_messages: list[tuple[int, int]] = []  # (delivered, RSS KiB): the first sample at each multiple of ``every``
    for _, count, rss in samples:
        if count >= (len(by_messages) + 1) * every:
            by_messages.append((count, rss))
    return {
        "messages": n,
        "sample_every_messages": every,
        "rss_by_messages_kib": by_messages,
        "seconds": time.monotonic() - t0,
        "rate_first_quarter_per_s": rate(0.0, 0.25),
        "rate_last_quarter_per_s": rate(0.75, 1.0),
        "rss_after_warmup_kib": after_warm,
        "rss_final_kib": final,
        "rss_max_kib": max((s[2] for s in samples), default=0),
        "growth_percent": (final / after_warm - 1) * 100 if after_warm else float("nan"),
        "samples": samples,
    }


# --- comparisons --------------------------------------------------------------------------------


def _compare_env(ctx: Context, settings: str | None) -> dict[str, str]:
    env = {"BENCH_COMPARE_DSN": ctx.compare_dsn, "PYTHONPATH": str(procs.ROOT)}
    return env | ({"DJANGO_SETTINGS_MODULE": settings} if settings else {})


def _compare_run(ctx: Context, module: str, *args: str, settings: str | None = None) -> str:
    """``python -m module *args`` in the comparison environment; its last line."""
    assert ctx.compare_python is not None
    return procs.last_line([ctx.compare_python, "-m", module, *args], env=_compare_env(ctx, settings))


def _peer(name: str, module: str, setup: str, worker: list[str], **kw: Any) -> tuple[System, str, str, str | None]:
    """A peer library's system: its worker (``-m ...`` in the comparison environment, or a command), its
    module's ``fill N`` (which prints the time of its commit) and ``setup`` command."""
    settings = kw.pop("settings", None)

    def start(c: Context) -> procs.Proc:
        assert c.compare_python is not None
        command = [c.compare_python, *worker] if worker[0] == "-m" else worker
        return procs.Proc(command, env=_compare_env(c, settings))

    fill = lambda c, n: float(_compare_run(c, module, "fill", str(n), settings=settings))  # noqa: E731
    system = System(name=name, start=start, fill=fill, dsn=lambda c: c.compare_dsn, **kw)
    return system, module, setup, settings


def _procrastinate_ready(c: Context, started: list[procs.Proc]) -> None:
    with psycopg.connect(c.compare_dsn, autocommit=True) as conn:

        def registered() -> bool:
            row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
            return bool(row and row[0] >= len(started))

        started[0].wait_for(registered, "workers registered")


def _peers(ctx: Context) -> list[tuple[System, str, str, str | None]]:
    assert ctx.compare_python is not None
    procrastinate = os.path.join(os.path.dirname(ctx.compare_python), "procrastinate")
    return [
        _peer(
            "procrastinate",
            "bench.compare.procrastinate_app",
            "schema",
            [procrastinate, "--app=bench.compare.procrastinate_app.app", "worker", "--queues=bench", "--concurrency=1"],
            ready=_procrastinate_ready,
            reset=("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE",),
            busy=busy_sql("procrastinate_jobs", "'todo', 'doing'"),
        ),
        _peer(
            "django-tasks-db",
            "bench.compare.django_tasks_app",
            "migrate",
            ["-m", "django", "db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload"],
            settings="bench.compare.tasks_settings",
            ready="Starting worker",
            reset=("TRUNCATE django_tasks_database_dbtaskresult",),
            busy=busy_sql("django_tasks_database_dbtaskresult", "'READY', 'RUNNING'"),
        ),
        _peer(
            "pgqueuer",
            "bench.compare.pgqueuer_app",
            "schema",
            ["-m", "bench.compare.pgqueuer_app", "worker"],
            ready="ready",
            reset=("TRUNCATE pgqueuer, pgqueuer_log",),
            busy=busy_sql("pgqueuer", "'queued', 'picked'"),
        ),
        _peer(
            "django-jaiminho",
            "bench.compare.jaiminho_app",
            "migrate",
            ["-m", "django", "events_relay", "--run-in-loop", "--loop-interval", "0.1"],
            settings="bench.compare.jaiminho_settings",
            ready="stream:",
            reset=("TRUNCATE jaiminho_event",),
            busy="SELECT EXISTS (SELECT 1 FROM jaiminho_event WHERE sent_at IS NULL)",
        ),
    ]


def compare(ctx: Context, reference: Json) -> Json:
    """Drain rate of other Python queues with a no-op task, against the references measured in this run."""
    if not ctx.compare_python:
        ctx.notes.append("comparisons skipped: no --compare-python (see docs/performance.md)")
        return {}
    tables.ensure_database(ctx.compare_dsn)
    result: Json = {"messages": ctx.sizes.compare_messages}
    for system, module, setup, settings in _peers(ctx):
        try:
            _compare_run(ctx, module, setup, settings=settings)
        except RuntimeError as exc:  # not installed in the comparison environment: say so, measure the rest
            ctx.notes.append(f"{system.name} skipped: {str(exc).splitlines()[-1]}")
            ctx.log(f"  {system.name} skipped (see notes)")
            continue
        by_processes: Json = {}
        for processes in ctx.sizes.drain_processes:
            rates = [drain_once(ctx, system, processes, ctx.sizes.compare_messages) for _ in range(ctx.sizes.reps)]
            ref = reference.get("by_processes", {}).get(str(processes), {})
            baseline, minimal = ref.get("baseline_per_s"), ref.get("minimal_per_s")
            by_processes[str(processes)] = {
                "per_s": median(rates),
                "ratio_to_baseline": median(rates) / baseline if baseline else None,
                "ratio_to_minimal": median(rates) / minimal if minimal else None,
                "reps": rates,
            }
            ctx.log(f"  {system.name} x{processes}: {median(rates):,.0f}/s")
        result[system.name] = by_processes
    return result


#: Server settings that move the figures, recorded with every run.
SERVER_SETTINGS = ("server_version", "autovacuum", "synchronous_commit", "fsync", "shared_buffers", "max_wal_size")


def environment(dsn: str | None = None) -> Json:
    import django

    info: Json = {
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        models = [line for line in open("/proc/cpuinfo").read().splitlines() if line.startswith("model name")]
        info["cpu"] = models[0].split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    if dsn is not None:
        with tables.connect(dsn) as conn:
            info["postgresql"] = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SERVER_SETTINGS}  # type: ignore[index]
    return info
