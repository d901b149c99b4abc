"""Each figure of docs/performance.md: how it is measured, always beside its reference in the same run.

Runs in the harness process, with Django set up on ``bench.settings``. Repetitions of a figure and of its
reference are interleaved (A B, B A, A B ...) so that drift in the shared machine's load hits both.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import psycopg

from . import procs, tables

Json = dict[str, Any]


@dataclass(kw_only=True)
class Sizes:
    reps: int
    send_transactions: int
    drain_messages: int
    drain_processes: tuple[int, ...]
    latency_messages: int
    history_small: int
    history_large: int
    claim_batches: int
    open_tx_seconds: float
    memory_messages: int
    compare_messages: int
    send_reps: int = 5
    #: transactions per enqueue round, split among the producers
    enqueue_transactions: int = 800
    enqueue_producers: tuple[int, ...] = (1, 4, 16)
    #: also drain with ``--concurrency 1`` at one process
    one_thread: bool = True
    #: the MariaDB section (bench/mariadb.py): backlog, process counts, send() transactions per kind and repetition
    mariadb_messages: int = 10_000
    mariadb_processes: tuple[int, ...] = (1, 2)
    mariadb_transactions: int = 300


SIZES = {
    "full": Sizes(
        reps=3,
        send_transactions=2000,
        drain_messages=40_000,
        drain_processes=(1, 2, 4),
        latency_messages=200,
        history_small=10_000,
        history_large=1_000_000,
        claim_batches=50,
        open_tx_seconds=60,
        memory_messages=200_000,
        compare_messages=3000,
        enqueue_transactions=1600,
        mariadb_messages=40_000,
        mariadb_transactions=1000,
    ),
    "quick": Sizes(
        reps=3,
        send_transactions=150,
        drain_messages=5000,
        drain_processes=(1, 2, 4),
        latency_messages=200,
        history_small=10_000,
        history_large=200_000,
        claim_batches=20,
        open_tx_seconds=5,
        memory_messages=30_000,
        compare_messages=500,
        one_thread=False,
    ),
    "smoke": Sizes(
        reps=1,
        send_transactions=20,
        drain_messages=300,
        drain_processes=(1,),
        latency_messages=10,
        history_small=1000,
        history_large=2000,
        claim_batches=3,
        open_tx_seconds=1,
        memory_messages=500,
        compare_messages=50,
        send_reps=1,
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


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def interleaved(reps: int) -> list[bool]:
    """For each repetition, whether the measured thing goes first (alternating)."""
    return [rep % 2 == 0 for rep in range(reps)]


# --- a. send() overhead -----------------------------------------------------------------------


#: What a hand-written outbox would run: the same row and wake-up, one statement, no validation.
HAND_WRITTEN_SEND = (
    "WITH m AS (INSERT INTO django_outbox_message (uuid, topic, key, payload, headers, idempotency_key, status,"
    " attempts, max_attempts, available_at, created_at, last_error)"
    " VALUES (gen_random_uuid(), 'bench.noop', NULL, %s::jsonb, '{}', NULL, 'pending', 0, 5, now(), now(), '')"
    " RETURNING id) SELECT pg_notify('django_outbox', '') FROM m"
)


def send_overhead(ctx: Context) -> Json:
    """Per-transaction times with and without ``send()``, the kinds interleaved one by one.

    Interleaving each transaction (not each run) makes every kind see the same load of a shared machine;
    the figure is the ratio of the median transaction times. The floor is the same business transaction
    plus one hand-written ``INSERT`` of the same row into the minimal twin table (``minimal``: what no
    outbox can beat, one statement into a table with nothing but a primary key and the pending index).
    Beside it: the same row and NOTIFY written by hand into the project's own table (``hand_written``),
    and a second business row through the ORM (what any extra ``INSERT`` costs the view).
    """
    import json

    from django.db import connection, transaction
    from django.test import override_settings

    from django_outbox import outbox
    from testproject.shop.models import Order

    from .minimal_relay import INSERT_ONE

    ensure_minimal(ctx)
    n = ctx.sizes.send_transactions

    def one(mode: str, i: int) -> float:
        started = time.perf_counter()
        with transaction.atomic():
            order = Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3)
            payload = {"order_id": order.pk, "item": order.item, "quantity": order.quantity}
            if mode == "send":
                outbox.send("bench.noop", payload)
            elif mode == "minimal":
                with connection.cursor() as cursor:
                    cursor.execute(INSERT_ONE, [json.dumps(payload)])
            elif mode == "hand_written":
                with connection.cursor() as cursor:
                    cursor.execute(HAND_WRITTEN_SEND, [json.dumps(payload)])
            elif mode == "second_row":
                Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3)
        return time.perf_counter() - started

    def run(modes: list[str]) -> dict[str, float]:
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(n):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                times[mode].append(one(mode, i))
        return {mode: median(values) * 1e6 for mode, values in times.items()}

    modes = ["plain", "send", "minimal", "hand_written", "second_row"]
    run(modes)  # warm-up: connections, caches, plans
    reps: list[Json] = []
    for _ in range(ctx.sizes.send_reps):
        times = run(modes)
        with override_settings(OUTBOX={**_outbox_settings(), "NOTIFY": False}):
            quiet = run(["plain", "send", "minimal"])
        times["plain_2"], times["send_no_notify"], times["minimal_2"] = quiet["plain"], quiet["send"], quiet["minimal"]
        reps.append(times)
        ctx.log("  send: " + ", ".join(f"{k} {v:.0f} µs" for k, v in times.items()))

    def ratio(mode: str, reference: str = "plain") -> float:
        return median([r[mode] / r[reference] for r in reps])

    send_ratio = ratio("send")
    floor_ratio = ratio("send", "minimal")
    return {
        "transactions": n,
        "plain_us_per_tx": median([r["plain"] for r in reps]),
        "send_us_per_tx": median([r["send"] for r in reps]),
        "minimal_us_per_tx": median([r["minimal"] for r in reps]),
        "hand_written_us_per_tx": median([r["hand_written"] for r in reps]),
        "second_row_us_per_tx": median([r["second_row"] for r in reps]),
        "send_no_notify_us_per_tx": median([r["send_no_notify"] for r in reps]),
        "ratio": send_ratio,
        "ratio_minimal": ratio("minimal"),
        "ratio_hand_written": ratio("hand_written"),
        "ratio_second_row": ratio("second_row"),
        "ratio_no_notify": ratio("send_no_notify", "plain_2"),
        # the target's figure: send() over the floor, the same transaction with one minimal INSERT
        "ratio_to_floor": floor_ratio,
        "ratio_to_floor_no_notify": ratio("send_no_notify", "minimal_2"),
        # send()'s added cost over the minimal statement's added cost: 1.0 is the hand-written limit.
        "added_cost_vs_minimal": median([(r["send"] - r["plain"]) / (r["minimal"] - r["plain"]) for r in reps]),
        "added_cost_vs_hand_written": median(
            [(r["send"] - r["plain"]) / (r["hand_written"] - r["plain"]) for r in reps]
        ),
        "target": "send <= 1.1x the floor (aim 1.05x)",
        "ok": floor_ratio <= 1.1,
        "reps": reps,
    }


def send_batch(ctx: Context) -> Json:
    """100 messages in one transaction against one, and the same for the hand-written floor.

    Uses ``outbox.send_many()`` when the installed outbox has it, otherwise a loop of ``send()`` (the
    result says which: ``api``). The floor writes its 100 rows with one ``INSERT ... SELECT unnest(...)``.
    """
    import json

    from django.db import connection, transaction

    from django_outbox import outbox
    from testproject.shop.models import Order

    from .minimal_relay import INSERT_MANY, INSERT_ONE

    ensure_minimal(ctx)
    has_many = hasattr(outbox, "send_many")
    n = max(4, ctx.sizes.send_transactions // 5)

    def one(mode: str, i: int) -> float:
        started = time.perf_counter()
        with transaction.atomic():
            order = Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3)
            payloads = [{"order_id": order.pk, "item": order.item, "n": j} for j in range(100 if "100" in mode else 1)]
            if mode.startswith("send"):
                if has_many:
                    outbox.send_many([{"topic": "bench.noop", "payload": p} for p in payloads])
                else:
                    for p in payloads:
                        outbox.send("bench.noop", p)
            else:
                with connection.cursor() as cursor:
                    if len(payloads) == 1:
                        cursor.execute(INSERT_ONE, [json.dumps(payloads[0])])
                    else:
                        cursor.execute(INSERT_MANY, [[json.dumps(p) for p in payloads]])
        return time.perf_counter() - started

    modes = ["send_1", "send_100", "floor_1", "floor_100"]
    reps: list[Json] = []
    for rep in range(ctx.sizes.send_reps + 1):
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(n):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                times[mode].append(one(mode, i))
        if rep == 0:
            continue  # warm-up
        medians = {mode: median(values) * 1e6 for mode, values in times.items()}
        reps.append(medians)
        ctx.log("  batch: " + ", ".join(f"{k} {v:.0f} µs" for k, v in medians.items()))
    ratio = median([r["send_100"] / r["send_1"] for r in reps])
    return {
        "api": "send_many" if has_many else "a loop of send(): no send_many in this tree",
        "transactions": n,
        "send_1_us": median([r["send_1"] for r in reps]),
        "send_100_us": median([r["send_100"] for r in reps]),
        "floor_1_us": median([r["floor_1"] for r in reps]),
        "floor_100_us": median([r["floor_100"] for r in reps]),
        "ratio": ratio,
        "floor_ratio": median([r["floor_100"] / r["floor_1"] for r in reps]),
        "ratio_100_to_floor_100": median([r["send_100"] / r["floor_100"] for r in reps]),
        "target": "100 in one transaction <= 2x one",
        "ok": ratio <= 2.0,
        "reps": reps,
    }


def ensure_minimal(ctx: Context) -> None:
    """Create the minimal twin table once per run, from the project's table as it is now."""
    if ctx.minimal_made:
        return
    from .minimal_relay import CREATE

    with tables.connect(ctx.dsn) as conn:
        for statement in CREATE:
            conn.execute(statement)
    ctx.minimal_made = True


def _outbox_settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.OUTBOX)


# --- b. drain throughput ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class System:
    """Something that drains a backlog: how to start one worker, fill the backlog, see that it is done."""

    name: str
    start: Callable[[Context], procs.Proc]
    ready: Callable[[Context, list[procs.Proc]], None]
    reset: Callable[[Context], None]
    fill: Callable[[Context, int], float]


def _outbox_ready(ctx: Context, started: list[procs.Proc]) -> None:
    for p in started:
        p.wait_for_line("relaying")


def _baseline_ready(ctx: Context, started: list[procs.Proc]) -> None:
    for p in started:
        p.wait_for_line("ready")


def _outbox_reset(ctx: Context) -> None:
    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)


def _outbox_fill(ctx: Context, n: int) -> float:
    with tables.connect(ctx.dsn) as conn:
        return tables.fill_pending(conn, n, analyze=True)


def _outbox_system(name: str, *options: str) -> System:
    """``manage.py outbox_worker`` with batches of 100 and ``options``, on the outbox's own table."""
    return System(
        name=name,
        start=lambda ctx: procs.outbox_worker(ctx.dsn, "--batch-size", "100", *options),
        ready=_outbox_ready,
        reset=_outbox_reset,
        fill=_outbox_fill,
    )


OUTBOX = _outbox_system("outbox")
#: The outbox worker with one delivery thread: what one database connection of it drains.
OUTBOX_ONE_THREAD = _outbox_system("outbox_one_thread", "--concurrency", "1")
BASELINE = System(
    name="baseline",
    start=lambda ctx: procs.baseline_relay(ctx.dsn),
    ready=_baseline_ready,
    reset=_outbox_reset,
    fill=_outbox_fill,
)


def _minimal_reset(ctx: Context) -> None:
    from .minimal_relay import TABLE

    ensure_minimal(ctx)
    with tables.connect(ctx.dsn) as conn:
        conn.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")


def _minimal_fill(ctx: Context, n: int) -> float:
    """Like :func:`tables.fill_pending`: one transaction, analyzed before it commits, one NOTIFY."""
    from .minimal_relay import FILL, TABLE

    with tables.connect(ctx.dsn) as conn:
        with conn.transaction():
            conn.execute(FILL, {"n": n})
            conn.execute(f"ANALYZE {TABLE}")
            conn.execute("SELECT pg_notify('bench_minimal', '')")
        return time.time()


#: The minimal reference: the hand-written relay on the minimal twin table (bench/minimal_relay.py).
MINIMAL = System(
    name="minimal",
    start=lambda ctx: procs.minimal_relay(ctx.dsn),
    ready=_baseline_ready,
    reset=_minimal_reset,
    fill=_minimal_fill,
)


def drain_once(ctx: Context, system: System, processes: int, n: int) -> float:
    """Messages per second for ``processes`` idle workers to drain a backlog of ``n`` committed at once."""
    system.reset(ctx)
    started = [system.start(ctx) for _ in range(processes)]
    try:
        system.ready(ctx, started)
        time.sleep(0.5)  # let them settle into their idle wait
        t0 = system.fill(ctx, n)
        poll = psycopg.connect(ctx.compare_dsn if system.name in COMPARE_NAMES else ctx.dsn, autocommit=True)
        with poll:
            deadline = time.monotonic() + 120 + n / 100  # a stuck worker (e.g. failing queries) must not hang the run
            while _busy_on(poll, system) and time.monotonic() < deadline:
                for p in started:
                    if not p.alive():
                        raise RuntimeError(f"{system.name} worker died:\n" + "\n".join(p.lines[-30:]))
                time.sleep(0.01)
            t1 = time.time()
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{system.name} did not drain {n} messages:\n" + "\n".join(started[0].lines[-30:]))
    finally:
        procs.stop_all(started)
    return n / (t1 - t0)


def _busy_on(conn: psycopg.Connection[tuple[object, ...]], system: System) -> bool:
    sql = BUSY_SQL.get(system.name, BUSY_SQL["outbox"])
    row = conn.execute(sql).fetchone()
    return bool(row and row[0])


BUSY_SQL = {
    "minimal": "SELECT EXISTS (SELECT 1 FROM bench_minimal_message WHERE status IN ('pending', 'processing'))",
    "outbox": "SELECT EXISTS (SELECT 1 FROM django_outbox_message WHERE status IN ('pending', 'processing'))",
    "procrastinate": "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
    "django-tasks-db": (
        "SELECT EXISTS (SELECT 1 FROM django_tasks_database_dbtaskresult WHERE status IN ('READY', 'RUNNING'))"
    ),
    "pgqueuer": "SELECT EXISTS (SELECT 1 FROM pgqueuer WHERE status IN ('queued', 'picked'))",
    "django-jaiminho": "SELECT EXISTS (SELECT 1 FROM jaiminho_event WHERE sent_at IS NULL)",
}
COMPARE_NAMES = ("procrastinate", "django-tasks-db", "pgqueuer", "django-jaiminho")


def drain(ctx: Context) -> Json:
    """Each process count against both references with as many processes, in the same rounds.

    The references: the minimal relay on the minimal twin table (``minimal``, the physical limit) and
    the hand-written relay on the project's own table (``baseline``, what the schema costs a careful
    hand-written relay). Each repetition runs every system once, in an order rotated by one each
    repetition, so each sees every position. The outbox runs with its defaults, as ``manage.py
    outbox_worker`` would (two delivery threads per process on PostgreSQL); with ``one_thread`` it also
    runs at one process with ``--concurrency 1``, one connection against each reference's one.
    """
    result: Json = {"messages": ctx.sizes.drain_messages, "batch_size": 100, "by_processes": {}}
    for processes in ctx.sizes.drain_processes:
        reps: list[Json] = []
        systems = [OUTBOX, BASELINE, MINIMAL]
        if processes == 1 and ctx.sizes.one_thread:
            systems.insert(1, OUTBOX_ONE_THREAD)
        for rep in range(ctx.sizes.reps):
            order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
            rates: dict[str, float] = {}
            for system in order:
                rates[system.name] = drain_once(ctx, system, processes, ctx.sizes.drain_messages)
            reps.append(rates)
            ctx.log(f"  drain x{processes}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
        ratio = median([r["outbox"] / r["minimal"] for r in reps])
        figure: Json = {
            "outbox_per_s": median([r["outbox"] for r in reps]),
            "baseline_per_s": median([r["baseline"] for r in reps]),
            "minimal_per_s": median([r["minimal"] for r in reps]),
            "ratio": ratio,
            "ratio_same_table": median([r["outbox"] / r["baseline"] for r in reps]),
            "same_table_to_minimal": median([r["baseline"] / r["minimal"] for r in reps]),
            "target": ">= 0.5x the minimal reference (aim 0.8x)",
            "ok": ratio >= 0.5,
            "reps": reps,
        }
        if OUTBOX_ONE_THREAD.name in reps[0]:
            figure["one_thread_per_s"] = median([r[OUTBOX_ONE_THREAD.name] for r in reps])
            figure["ratio_one_thread"] = median([r[OUTBOX_ONE_THREAD.name] / r["minimal"] for r in reps])
        result["by_processes"][str(processes)] = figure
    return result


# --- c. latency -------------------------------------------------------------------------------


GAP = tuple(float(x) for x in os.environ.get("BENCH_LATENCY_GAP", "0.005,0.015").split(","))


def latency(ctx: Context, *, database: str) -> Json:
    """Commit to handler start for messages sent one per transaction to an idle worker."""
    from django.db import transaction

    from django_outbox import outbox

    if database == "default":  # start from an empty, vacuumed table, whatever ran before
        with tables.connect(ctx.dsn) as conn:
            tables.truncate(conn)
            tables.vacuum(conn)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.2)
    port = receiver.getsockname()[1]
    arrived: dict[int, float] = {}
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                data = receiver.recv(100)
            except TimeoutError:
                continue
            message_id, at = data.decode().split()
            arrived[int(message_id)] = float(at)

    listener = threading.Thread(target=receive, daemon=True)
    listener.start()
    poll_interval = "1.0"
    worker = procs.outbox_worker(
        ctx.dsn,
        "--database",
        database,
        env={"BENCH_UDP_PORT": str(port), "BENCH_POLL_INTERVAL": poll_interval},
    )
    reps: list[Json] = []
    try:
        worker.wait_for_line("relaying")
        time.sleep(1.0)
        for _ in range(ctx.sizes.reps):
            arrived.clear()
            committed: dict[int, float] = {}
            for i in range(ctx.sizes.latency_messages):
                with transaction.atomic(using=database):
                    message = outbox.send("bench.latency", {"n": i}, headers={"bench-latency": "1"}, using=database)
                    committed[message.id] = time.time()  # before COMMIT: the figure includes the commit itself
                time.sleep(random.uniform(*GAP))
            deadline = time.monotonic() + 10
            while len(arrived) < len(committed) and time.monotonic() < deadline:
                time.sleep(0.05)
            ms = [(arrived[k] - committed[k]) * 1000 for k in committed if k in arrived]
            rep = {
                "p50_ms": percentile(ms, 50),
                "p95_ms": percentile(ms, 95),
                "p99_ms": percentile(ms, 99),
                "received": len(ms),
                "sent": len(committed),
            }
            reps.append(rep)
            ctx.log(f"  latency {database}: " + ", ".join(f"{k} {v:.1f}" for k, v in rep.items()))
    finally:
        worker.stop()
        done.set()
        listener.join()
        receiver.close()
    result: Json = {
        "database": database,
        "messages_per_rep": ctx.sizes.latency_messages,
        "p50_ms": median([r["p50_ms"] for r in reps]),
        "p95_ms": median([r["p95_ms"] for r in reps]),
        "p99_ms": median([r["p99_ms"] for r in reps]),
        "lost": sum(r["sent"] - r["received"] for r in reps),
        "reps": reps,
    }
    if database == "default":
        result["target"] = "p50 <= 5 ms, p99 <= 20 ms"
        result["ok"] = result["p50_ms"] <= 5 and result["p99_ms"] <= 20 and result["lost"] == 0
    else:
        result["poll_interval_s"] = float(poll_interval)
    return result


def neighbour_dsn(ctx: Context) -> str:
    parsed = urlparse(ctx.dsn)
    return parsed._replace(path=parsed.path + "_neighbour").geturl()


def latency_neighbour(ctx: Context) -> Json:
    """Commit to handler, unkeyed and keyed, without and with a busy neighbour database on the same server.

    One idle worker (PostgreSQL, NOTIFY) and, beside it, the minimal relay waiting for a NOTIFY of its
    own (the reference). Each phase sends ``latency_messages`` messages one per transaction, 5-15 ms
    apart, in turn a keyed one (ten keys in turn), an unkeyed one and a row of the minimal table, so the
    kinds share every moment of the machine. In the ``busy`` phase ``bench/neighbour.py`` runs tiny write
    transactions without pause in another database of the same server (``<name>_neighbour``); the
    phases alternate their order from one repetition to the next. Each figure is the median over the
    repetitions of the per-repetition percentile; the keyed/unkeyed ratios are taken within a phase.
    """
    from django.db import transaction

    from django_outbox import outbox

    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)
        tables.vacuum(conn)
    tables.ensure_database(neighbour_dsn(ctx))
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.2)
    port = receiver.getsockname()[1]
    arrived: dict[str, float] = {}  # "<id>" for the outbox's messages, "m<id>" for the minimal relay's rows
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                data = receiver.recv(100)
            except TimeoutError:
                continue
            message_id, at = data.decode().split()
            arrived[message_id] = float(at)

    listener = threading.Thread(target=receive, daemon=True)
    listener.start()
    import json

    from django.db import connection

    from .minimal_relay import INSERT_ONE

    ensure_minimal(ctx)
    _minimal_reset(ctx)
    worker = procs.outbox_worker(ctx.dsn, env={"BENCH_UDP_PORT": str(port), "BENCH_POLL_INTERVAL": "1.0"})
    minimal = procs.Proc(
        [
            sys.executable,
            str(procs.ROOT / "bench" / "minimal_relay.py"),
            ctx.dsn,
            "--listen",
            "bench_minimal",
            "--udp-port",
            str(port),
        ]
    )
    reps: list[Json] = []

    def phase(busy: bool, *, flush: bool = True) -> Json:
        neighbour = None
        if busy:
            neighbour = procs.Proc([sys.executable, str(procs.ROOT / "bench" / "neighbour.py"), neighbour_dsn(ctx)])
            neighbour.wait_for_line("ready")
            time.sleep(0.3)
        try:
            arrived.clear()
            committed: dict[str, tuple[float, str]] = {}
            returned: dict[str, float] = {}  # when COMMIT returned: the commit's own time is the difference
            for i in range(ctx.sizes.latency_messages):
                kind = LATENCY_KINDS[i % len(LATENCY_KINDS)]
                with transaction.atomic():
                    if not flush:  # this transaction only: COMMIT returns (and NOTIFY goes) before the WAL flush
                        with connection.cursor() as cursor:
                            cursor.execute("SET LOCAL synchronous_commit = off")
                    if kind == "minimal":  # the reference: one row into the minimal table, one NOTIFY
                        with connection.cursor() as cursor:
                            cursor.execute(INSERT_ONE + " RETURNING id", [json.dumps({"n": i})])
                            row_id = f"m{cursor.fetchone()[0]}"
                            cursor.execute("SELECT pg_notify('bench_minimal', '')")
                    else:
                        message = outbox.send(
                            "bench.latency",
                            {"n": i},
                            key=f"k{i // len(LATENCY_KINDS) % 10}" if kind == "keyed" else None,
                            headers={"bench-latency": "1"},
                        )
                        row_id = str(message.id)
                    committed[row_id] = (time.time(), kind)  # before COMMIT: the figure includes it
                returned[row_id] = time.time()
                time.sleep(random.uniform(*GAP))
            deadline = time.monotonic() + 15
            while len(arrived) < len(committed) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if neighbour is not None:
                neighbour.stop()
        result: Json = {"lost": sum(1 for k in committed if k not in arrived)}
        if neighbour is not None:
            ran = [line for line in neighbour.lines if line.startswith("transactions ")]
            result["neighbour_transactions"] = int(ran[-1].split()[1]) if ran else 0
        for kind in LATENCY_KINDS:
            ms = [(arrived[k] - at) * 1000 for k, (at, sent) in committed.items() if sent == kind and k in arrived]
            result[kind] = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms, default=0)}
            # The split: COMMIT's own round trip (the WAL flush), then from its return to the handler (the
            # wake-up: NOTIFY, listener, claim). A handler can start before COMMIT returns to the sender.
            commit = [(returned[k] - at) * 1000 for k, (at, sent) in committed.items() if sent == kind]
            after = [
                (arrived[k] - returned[k]) * 1000 for k, (_, sent) in committed.items() if sent == kind and k in arrived
            ]
            result[kind]["commit_p50_ms"] = percentile(commit, 50)
            result[kind]["commit_p99_ms"] = percentile(commit, 99)
            result[kind]["after_commit_p50_ms"] = percentile(after, 50)
            result[kind]["after_commit_p99_ms"] = percentile(after, 99)
        return result

    try:
        minimal.wait_for_line("ready")
        worker.wait_for_line("relaying")
        time.sleep(1.0)
        for first in interleaved(ctx.sizes.reps):
            rep: Json = {}
            for busy in [False, True] if first else [True, False]:
                rep["busy" if busy else "idle"] = phase(busy)
            # The same idle phase with the senders' commits not waiting for the disk: what is left is the
            # wake-up path alone, for the outbox and the minimal relay alike (design against machine).
            rep["idle_async"] = phase(False, flush=False)
            reps.append(rep)
            ctx.log(
                "  latency: "
                + "; ".join(
                    f"{p} {k} p50 {rep[p][k]['p50_ms']:.1f} p99 {rep[p][k]['p99_ms']:.1f}"
                    for p in ("idle", "busy", "idle_async")
                    for k in ("unkeyed", "keyed", "minimal")
                )
            )
    finally:
        worker.stop()
        minimal.stop()
        done.set()
        listener.join()
        receiver.close()
    out: Json = {"messages_per_phase": ctx.sizes.latency_messages, "reps": reps}
    for p in ("idle", "busy", "idle_async"):
        fig: Json = {"lost": sum(r[p]["lost"] for r in reps)}
        for k in LATENCY_KINDS:
            fig[k] = {q: median([r[p][k][q] for r in reps]) for q in LATENCY_FIGURES}
        fig["unkeyed_p50_to_minimal"] = median(
            [_safe_ratio(r[p]["unkeyed"]["p50_ms"], r[p]["minimal"]["p50_ms"]) for r in reps]
        )
        fig["keyed_p50_ratio"] = median([_safe_ratio(r[p]["keyed"]["p50_ms"], r[p]["unkeyed"]["p50_ms"]) for r in reps])
        fig["keyed_p99_ratio"] = median([_safe_ratio(r[p]["keyed"]["p99_ms"], r[p]["unkeyed"]["p99_ms"]) for r in reps])
        out[p] = fig
    idle, busy = out["idle"], out["busy"]
    out["target"] = "idle p50 <= 2 ms, p99 <= 5 ms; busy keyed p50 <= 2x, p99 <= 3x unkeyed"
    out["ok_idle"] = idle["unkeyed"]["p50_ms"] <= 2 and idle["unkeyed"]["p99_ms"] <= 5
    out["ok_keyed"] = busy["keyed_p50_ratio"] <= 2 and busy["keyed_p99_ratio"] <= 3
    out["ok"] = out["ok_idle"] and out["ok_keyed"] and idle["lost"] + busy["lost"] == 0
    return out


#: The latency figure's messages, in turn: the outbox's keyed and unkeyed, and the minimal relay's rows.
LATENCY_KINDS = ("keyed", "unkeyed", "minimal")
#: Per kind and phase: commit to handler, then its split (COMMIT's own time, and from its return on).
LATENCY_FIGURES = (
    "p50_ms",
    "p99_ms",
    "max_ms",
    "commit_p50_ms",
    "commit_p99_ms",
    "after_commit_p50_ms",
    "after_commit_p99_ms",
)


def _safe_ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("nan")


# --- enqueue concurrency ------------------------------------------------------------------------

ENQUEUE_MODES = ("send", "floor_notify", "send_quiet", "floor")


def _ratio(reps: list[Json], mode: str, reference: str) -> float:
    return median([r[mode] / r[reference] for r in reps])


def _rates(per: int, reps: list[Json], modes: tuple[str, ...], **ratios: tuple[str, str]) -> Json:
    """The figure of a producers' run: each mode's median rate, the named ratios, and every repetition."""
    return {
        "transactions_per_producer": per,
        **{f"{mode}_per_s": median([r[mode] for r in reps]) for mode in modes},
        **{name: _ratio(reps, mode, reference) for name, (mode, reference) in ratios.items()},
        "reps": reps,
    }


def _producer_reps(ctx: Context, producers: int, per: int, modes: tuple[str, ...]) -> list[Json]:
    """Per repetition, transactions per second of each of ``modes`` (``bench/producer.py``), the modes'
    order reversed every other repetition."""
    plan: list[str] = []
    for first in interleaved(ctx.sizes.reps):
        plan += list(modes) if first else list(modes)[::-1]
    rounds = _producer_rounds(ctx, producers, per, plan)
    return [dict(rounds[i : i + len(modes)]) for i in range(0, len(rounds), len(modes))]


def _producer_rounds(ctx: Context, producers: int, per: int, plan: list[str]) -> list[tuple[str, float]]:
    """Transactions per second of each round of ``plan`` (``bench/producer.py`` modes), ``producers``
    processes at once, each running ``per`` transactions a round; a round starts when its file appears."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-producers-") as go_dir:
        started = [
            procs.Proc(
                [sys.executable, str(procs.ROOT / "bench" / "producer.py"), go_dir, str(per), *plan],
                env={"DATABASE_URL": ctx.dsn},
            )
            for _ in range(producers)
        ]
        rounds: list[tuple[str, float]] = []
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
    return rounds


def enqueue(ctx: Context) -> Json:
    """Transactions per second of 1, 4 and 16 producer processes: send() against the floor, NOTIFY on and off.

    Each producer (``bench/producer.py``) is started once per concurrency and runs every mode in turn,
    each round released to all at once by a file, so that start-up is not timed and the modes alternate
    (their order reversed every other repetition). The floor is the same business transaction plus one
    hand-written ``INSERT`` into the minimal table, with ``pg_notify`` (``floor_notify``, against
    ``send`` with NOTIFY on) or without (``floor``, against ``send_quiet``, ``OUTBOX["NOTIFY"] = False``).
    """
    ensure_minimal(ctx)
    result: Json = {"by_producers": {}}
    for producers in ctx.sizes.enqueue_producers:
        per = max(4, ctx.sizes.enqueue_transactions // producers)
        reps = _producer_reps(ctx, producers, per, ENQUEUE_MODES)
        figure = _rates(per, reps, ENQUEUE_MODES, ratio_notify=("send", "floor_notify"))
        figure["ratio_quiet"] = _ratio(reps, "send_quiet", "floor")
        figure["notify_cost"] = _ratio(reps, "floor_notify", "floor")
        figure["ok"] = figure["ratio_notify"] >= 0.9 and figure["ratio_quiet"] >= 0.9
        result["by_producers"][str(producers)] = figure
        ctx.log(
            f"  enqueue x{producers}: "
            + ", ".join(f"{m} {figure[m + '_per_s']:,.0f} tx/s" for m in ENQUEUE_MODES)
            + f"; send/floor {figure['ratio_notify']:.2f}x (NOTIFY), {figure['ratio_quiet']:.2f}x (quiet)"
        )
    result["target"] = "send >= 0.9x the floor at the same concurrency"
    result["ok"] = all(f["ok"] for f in result["by_producers"].values())
    return result


KEYED_MODES = ("send_quiet", "key_many", "key_one")


def keyed_producers(ctx: Context) -> Json:
    """Transactions per second of 1, 4 and 16 producer processes sending keyed messages, against unkeyed.

    The cost of a keyed ``send()``: its key's lock (and the lock every keyed producer shares) taken before
    the row's id and held to commit. ``key_many``: each transaction a key of its own (the locks cost, no
    producer waits); ``key_one``: every producer on one key (they queue for its lock, one commit at a
    time). NOTIFY is off in all three, so the figure is the locks'. Rounds as in ``enqueue``.
    """
    ensure_minimal(ctx)  # the producers' warm-up writes to it
    result: Json = {"by_producers": {}}
    for producers in ctx.sizes.enqueue_producers:
        per = max(4, ctx.sizes.enqueue_transactions // producers)
        reps = _producer_reps(ctx, producers, per, KEYED_MODES)
        figure = _rates(per, reps, KEYED_MODES, ratio_key_many=("key_many", "send_quiet"))
        figure["ratio_key_one"] = _ratio(reps, "key_one", "send_quiet")
        result["by_producers"][str(producers)] = figure
        ctx.log(
            f"  keyed producers x{producers}: "
            + ", ".join(f"{m} {figure[m + '_per_s']:,.0f} tx/s" for m in KEYED_MODES)
            + f"; many keys {figure['ratio_key_many']:.2f}x, one key {figure['ratio_key_one']:.2f}x of unkeyed"
        )
    return result


# --- d. scale ---------------------------------------------------------------------------------


def claim_cost(ctx: Context) -> Json:
    """Milliseconds per claim (and per record) of 100 messages, with little and with much history.

    Each batch alternates between prepared statements (``prepared``, what the worker does by default) and
    ``OUTBOX["PREPARED_STATEMENTS"] = False`` (``unprepared``: Django's client-side binding), to show what
    preparing buys.
    """
    from django.db import connections
    from django.utils import timezone

    from django_outbox import store

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
            # Write the fill's pages out now: otherwise the checkpointer flushes them (for 2,000,000 rows,
            # hundreds of megabytes) while the claims are timed, and slows the large size's figures only.
            conn.execute("CHECKPOINT")
        record_errors: dict[str, str] = {}
        connections["default"].close()
        for alias in aliases:
            for _ in range(6):  # warm-up: connection, catalog caches, the prepared statements
                _claim_and_record(alias, store, timezone, record_errors)
        reps: list[Json] = []
        for _ in range(ctx.sizes.reps):
            times: dict[str, list[float]] = {f"{kind}_{alias}": [] for kind in ("claim", "record") for alias in aliases}
            times["reference"] = []
            for i in range(batches):
                if i % 2 == 1:
                    times["reference"].append(_reference_lookup(history) * 1000)
                for alias in aliases if i % 2 == 0 else aliases[::-1]:
                    claim_s, record_s = _claim_and_record(alias, store, timezone, record_errors)
                    times[f"claim_{alias}"].append(claim_s * 1000)
                    if record_s is not None:
                        times[f"record_{alias}"].append(record_s * 1000)
                if i % 2 == 0:
                    times["reference"].append(_reference_lookup(history) * 1000)
            medians = {k: median(v) for k, v in times.items() if v}
            medians["claim_over_reference"] = medians["claim_prepared"] / medians["reference"]
            reps.append(medians)
        figure: Json = {
            "history_rows": history,
            **{k: median([r[k] for r in reps if k in r]) for k in reps[0]},
            "reps": reps,
        }
        figure["claim_ms"] = figure["claim_prepared"]
        figure["reference_ms"] = figure["reference"]
        figure["record_ms"] = figure["record_prepared"]
        if record_errors:
            figure["record_errors"] = record_errors
        per_size[label] = figure
        ctx.log(f"  with {history:,} rows of history: " + ", ".join(f"{k} {v:.2f} ms" for k, v in reps[-1].items()))
    raw = per_size["large"]["claim_ms"] / per_size["small"]["claim_ms"]
    # the target's figure: the claim in units of the same run's primary-key lookup, large over small
    ratio = per_size["large"]["claim_over_reference"] / per_size["small"]["claim_over_reference"]
    return {
        **per_size,
        "ratio": ratio,
        "raw_ratio": raw,
        "reference_ratio": per_size["large"]["reference_ms"] / per_size["small"]["reference_ms"],
        "record_ratio": per_size["large"]["record_ms"] / per_size["small"]["record_ms"],
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


def _claim_and_record(mode: str, store: Any, timezone: Any, errors: dict[str, str]) -> tuple[float, float | None]:
    """Times of one claim of 100 and of recording them, with prepared statements on or off (``mode``)."""
    from django.db import DatabaseError
    from django.test import override_settings

    with override_settings(OUTBOX={**_outbox_settings(), "PREPARED_STATEMENTS": mode == "prepared"}):
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
    """Throughput of one worker while another session holds a transaction open, against none.

    The transaction (with an xid, so vacuum must keep every row version it might see) is opened before
    the backlog is committed and held for the whole window; the worker drains until the backlog is gone
    or the window ends. The backlog is sized to last about the window at the rate measured in b.
    """
    window = ctx.sizes.open_tx_seconds
    backlog = int(min(400_000, max(1000, expected_rate * window)))

    def once(hold: bool) -> float:
        _outbox_reset(ctx)
        holder = psycopg.connect(ctx.dsn) if hold else None
        worker = OUTBOX.start(ctx)
        try:
            OUTBOX.ready(ctx, [worker])
            time.sleep(0.5)
            if holder is not None:
                holder.execute("SELECT txid_current()")  # an xid: vacuum cannot remove what it might see
            t0 = _outbox_fill(ctx, backlog)
            with tables.connect(ctx.dsn) as conn:
                while time.time() < t0 + window and _busy_on(conn, OUTBOX):
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
        rates: dict[str, float] = {}
        for hold in [True, False] if first else [False, True]:
            rates["held" if hold else "free"] = once(hold)
        reps.append(rates)
        ctx.log(f"  open transaction ({window:.0f}s): " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
    ratio = median([r["held"] / r["free"] for r in reps])
    return {
        "window_s": window,
        "backlog": backlog,
        "free_per_s": median([r["free"] for r in reps]),
        "held_per_s": median([r["held"] for r in reps]),
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
    worker = procs.outbox_worker(ctx.dsn, "--until-empty", "--batch-size", "100")
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
            if not rss:  # exited but not yet reaped: /proc has no VmRSS line (it read as 0 MiB at the end)
                break
            samples.append((time.monotonic() - t0, delivered, rss))
            time.sleep(0.25)
        code = worker.stop()
    finally:
        worker.stop()
    if code != 0:
        raise RuntimeError("memory run: worker failed:\n" + "\n".join(worker.lines[-30:]))
    warm = [s for s in samples if s[1] >= n * 0.1] or samples
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


def _compare_env(ctx: Context) -> dict[str, str]:
    return {"BENCH_COMPARE_DSN": ctx.compare_dsn, "PYTHONPATH": str(procs.ROOT)}


def _compare_run(ctx: Context, *args: str, settings: str | None = None) -> str:
    assert ctx.compare_python is not None
    env = _compare_env(ctx)
    if settings:
        env["DJANGO_SETTINGS_MODULE"] = settings
    p = procs.Proc([ctx.compare_python, *args], env=env)
    code = p.proc.wait(timeout=900)
    p.join_output()
    if code != 0:
        raise RuntimeError(f"{args}: exit {code}:\n" + "\n".join(p.lines[-30:]))
    return p.lines[-1] if p.lines else ""


TASKS_SETTINGS = "bench.compare.tasks_settings"


def _procrastinate(ctx: Context) -> System:
    def start(c: Context) -> procs.Proc:
        assert c.compare_python is not None
        cli = os.path.join(os.path.dirname(c.compare_python), "procrastinate")
        return procs.Proc(
            [cli, "--app=bench.compare.procrastinate_app.app", "worker", "--queues", "bench", "--concurrency", "1"],
            env=_compare_env(c),
        )

    def ready(c: Context, started: list[procs.Proc]) -> None:
        with psycopg.connect(c.compare_dsn, autocommit=True) as conn:

            def registered() -> bool:
                row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
                return bool(row and row[0] >= len(started))

            started[0].wait_for(registered, "workers registered")

    def reset(c: Context) -> None:
        with psycopg.connect(c.compare_dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE")

    return System(
        name="procrastinate",
        start=start,
        ready=ready,
        reset=reset,
        fill=lambda c, n: float(_compare_run(c, "-m", "bench.compare.procrastinate_app", "fill", str(n))),
    )


def _django_tasks_ready(ctx: Context, started: list[procs.Proc]) -> None:
    for p in started:
        p.wait_for_line("Starting worker")


def _django_tasks(ctx: Context) -> System:
    def start(c: Context) -> procs.Proc:
        assert c.compare_python is not None
        env = {**_compare_env(c), "DJANGO_SETTINGS_MODULE": TASKS_SETTINGS}
        return procs.Proc(
            [c.compare_python, "-m", "django", "db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload"],
            env=env,
        )

    def reset(c: Context) -> None:
        with psycopg.connect(c.compare_dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE django_tasks_database_dbtaskresult")

    return System(
        name="django-tasks-db",
        start=start,
        ready=_django_tasks_ready,
        reset=reset,
        fill=lambda c, n: float(
            _compare_run(c, "-m", "bench.compare.django_tasks_app", "fill", str(n), settings=TASKS_SETTINGS)
        ),
    )


def _pgqueuer(ctx: Context) -> System:
    def start(c: Context) -> procs.Proc:
        assert c.compare_python is not None
        return procs.Proc([c.compare_python, "-m", "bench.compare.pgqueuer_app", "worker"], env=_compare_env(c))

    def reset(c: Context) -> None:
        with psycopg.connect(c.compare_dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log")

    return System(
        name="pgqueuer",
        start=start,
        ready=_baseline_ready,
        reset=reset,
        fill=lambda c, n: float(_compare_run(c, "-m", "bench.compare.pgqueuer_app", "fill", str(n))),
    )


JAIMINHO_SETTINGS = "bench.compare.jaiminho_settings"


def _jaiminho(ctx: Context) -> System:
    def start(c: Context) -> procs.Proc:
        assert c.compare_python is not None
        env = {**_compare_env(c), "DJANGO_SETTINGS_MODULE": JAIMINHO_SETTINGS}
        return procs.Proc(
            [c.compare_python, "-m", "django", "events_relay", "--run-in-loop", "--loop-interval", "0.1"], env=env
        )

    def ready(c: Context, started: list[procs.Proc]) -> None:
        for p in started:
            p.wait_for_line("stream:")

    def reset(c: Context) -> None:
        with psycopg.connect(c.compare_dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE jaiminho_event")

    return System(
        name="django-jaiminho",
        start=start,
        ready=ready,
        reset=reset,
        fill=lambda c, n: float(
            _compare_run(c, "-m", "bench.compare.jaiminho_app", "fill", str(n), settings=JAIMINHO_SETTINGS)
        ),
    )


def compare(ctx: Context, reference: Json) -> Json:
    """Drain rate of other Python queues with a no-op task, against the baseline measured in this run."""
    if not ctx.compare_python:
        ctx.notes.append("comparisons skipped: no --compare-python (see docs/performance.md)")
        return {}
    tables.ensure_database(ctx.compare_dsn)
    setups: list[tuple[Callable[[Context], System], tuple[str, ...], str | None]] = [
        (_procrastinate, ("-m", "bench.compare.procrastinate_app", "schema"), None),
        (_django_tasks, ("-m", "bench.compare.django_tasks_app", "migrate"), TASKS_SETTINGS),
        (_pgqueuer, ("-m", "bench.compare.pgqueuer_app", "schema"), None),
        (_jaiminho, ("-m", "bench.compare.jaiminho_app", "migrate"), JAIMINHO_SETTINGS),
    ]
    systems: list[System] = []
    for make, setup, settings in setups:
        system = make(ctx)
        try:
            _compare_run(ctx, *setup, settings=settings)
        except RuntimeError as exc:  # not installed in the comparison environment: say so, measure the rest
            ctx.notes.append(f"{system.name} skipped: {str(exc).splitlines()[-1]}")
            ctx.log(f"  {system.name} skipped (see notes)")
            continue
        systems.append(system)
    result: Json = {"messages": ctx.sizes.compare_messages}
    for system in systems:
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


#: Server settings that move the figures; recorded with every run (the shared server of the machine the
#: docs' figures come from runs with ``autovacuum = off``, for one).
SERVER_SETTINGS = ("server_version", "autovacuum", "synchronous_commit", "fsync", "shared_buffers", "max_wal_size")


def _show(conn: psycopg.Connection[tuple[object, ...]], name: str) -> str:
    row = conn.execute(f"SHOW {name}").fetchone()
    return str(row[0]) if row else ""


def environment(dsn: str | None = None) -> Json:
    import django

    info: Json = {
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        for line in open("/proc/cpuinfo").read().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if dsn is not None:
        with tables.connect(dsn) as conn:
            info["postgresql"] = {name: _show(conn, name) for name in SERVER_SETTINGS}
    return info
