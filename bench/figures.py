"""The figures of docs/performance.md that the harness measures in its own process (Django on ``bench.settings``):
each beside its reference in the same run (the hand-written floor of ``send()``, the relays of
bench/minimal_relay.py), their repetitions interleaved so that the shared machine's drift hits both."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg

from . import common, minimal_relay, procs, tables
from .common import Json, execute, median, medians, ratio


def _size(full: Any, quick: Any, smoke: Any) -> Any:
    """A field of ``Sizes``: its value in a full run (the default), a ``--quick`` and a ``--smoke`` one."""
    return field(default=full, metadata={"quick": quick, "smoke": smoke})


@dataclass(kw_only=True)
class Sizes:
    reps: int = _size(3, 3, 1)
    send_transactions: int = _size(2000, 150, 20)
    send_reps: int = _size(5, 5, 1)
    drain_messages: int = _size(40_000, 5000, 300)
    drain_processes: tuple[int, ...] = _size((1, 2, 4), (1, 2, 4), (1,))
    one_thread: bool = _size(True, False, True)  # also drain with ``--concurrency 1`` at one process
    latency_messages: int = _size(200, 200, 10)
    history_small: int = _size(10_000, 10_000, 1000)
    history_large: int = _size(1_000_000, 200_000, 2000)
    claim_batches: int = _size(50, 20, 3)
    open_tx_seconds: float = _size(60, 5, 1)
    memory_messages: int = _size(200_000, 30_000, 500)
    compare_messages: int = _size(3000, 500, 50)
    enqueue_transactions: int = _size(1600, 800, 32)  # per round, split among the producers
    enqueue_producers: tuple[int, ...] = _size((1, 4, 16), (1, 4, 16), (1, 4))
    mariadb_messages: int = _size(40_000, 10_000, 300)  # bench/mariadb.py: backlog, process counts, send() transactions
    mariadb_processes: tuple[int, ...] = _size((1, 2), (1, 2), (1,))
    mariadb_transactions: int = _size(1000, 300, 20)


SIZES = {"full": Sizes(), **{m: Sizes(**{f.name: f.metadata[m] for f in fields(Sizes)}) for m in ("quick", "smoke")}}


@dataclass(kw_only=True)
class Context:
    dsn: str
    sizes: Sizes
    compare_python: str | None = None
    log: Callable[[str], None] = print
    notes: list[str] = field(default_factory=list)
    minimal_made: bool = False

    def beside(self, suffix: str) -> str:
        """The DSN of the database ``<name><suffix>`` on the same server."""
        parsed = urlparse(self.dsn)
        return parsed._replace(path=parsed.path + suffix).geturl()

    def ensure_minimal(self) -> None:
        """Create the minimal twin table once per run, from the project's table as it is now."""
        if not self.minimal_made:
            with tables.connect(self.dsn) as conn:
                for statement in minimal_relay.CREATE:
                    conn.execute(statement)
            self.minimal_made = True

    def log_values(self, label: str, values: Json, unit: str) -> None:
        self.log(f"  {label}: " + ", ".join(f"{k} {v:,.1f} {unit}" for k, v in values.items()))


def outbox_settings(**changes: Any) -> Any:
    from django.conf import settings
    from django.test import override_settings

    return override_settings(OUTBOX={**settings.OUTBOX, **changes})


#: What a hand-written outbox would run: the same row and wake-up, one statement, no validation.
HAND_WRITTEN_SEND = (
    f"WITH m AS ({minimal_relay.insert(table=tables.MESSAGE)} RETURNING id)"
    " SELECT pg_notify('django_outbox', '') FROM m"
)


def _figure(reps: list[Json], keys: Sequence[str], suffix: str, **ratios: tuple[str, str]) -> Json:
    """The medians of ``keys`` over the repetitions, the ratios named ``(mode, reference)``, the repetitions."""
    return {**medians(reps, keys, suffix), **{name: ratio(reps, *pair) for name, pair in ratios.items()}, "reps": reps}


def _send_reps(
    ctx: Context, n: int, write: Callable[[str, Any], None], *modes: str, quiet: Sequence[str] = ()
) -> list[Json]:
    """µs per business transaction with ``write(mode, order)``, the modes interleaved one transaction at a time:
    a warm-up round, then ``send_reps`` rounds, each followed by the ``quiet`` modes with NOTIFY off."""

    def run(modes: Sequence[str]) -> dict[str, float]:
        return common.per_transaction(
            modes, n, lambda mode, i: common.business_transaction(i, lambda o: write(mode, o))
        )

    ctx.ensure_minimal()
    run(modes)  # connections, caches, plans
    reps: list[Json] = []
    for _ in range(ctx.sizes.send_reps):
        times = run(modes)
        if quiet:
            with outbox_settings(NOTIFY=False):
                times |= {f"{mode}_no_notify": t for mode, t in run(quiet).items()}
        reps.append(times)
        ctx.log_values("µs per transaction", times, "")
    return reps


def send_overhead(ctx: Context) -> Json:
    """``send()`` against the floor, one hand-written ``INSERT`` into the minimal twin table, NOTIFY on and off."""
    from django_outbox import outbox

    writes: dict[str, Callable[[Json], object]] = {
        "plain": lambda payload: None,
        "send": lambda payload: outbox.send("bench.noop", payload),
        "minimal": lambda payload: execute(minimal_relay.INSERT_ONE, [json.dumps(payload)]),
        "hand_written": lambda payload: execute(HAND_WRITTEN_SEND, [json.dumps(payload)]),
    }

    def write(mode: str, order: Any) -> None:
        writes[mode](common.order_payload(order))

    ratios = {
        "ratio_to_floor": ("send", "minimal"),  # the target's figure: at most 1.1x (aim 1.05x)
        "ratio_to_floor_no_notify": ("send_no_notify", "minimal_no_notify"),
    }
    reps = _send_reps(ctx, ctx.sizes.send_transactions, write, *writes, quiet=("send", "minimal"))
    return {"transactions": ctx.sizes.send_transactions, **_figure(reps, list(reps[0]), "_us_per_tx", **ratios)}


def send_batch(ctx: Context) -> Json:
    """``send_many()`` of 100 against one; the floor writes its 100 rows with one ``INSERT ... SELECT unnest(...)``."""
    from django_outbox import outbox

    def write(mode: str, order: Any) -> None:
        payloads = [{"order_id": order.pk, "item": order.item, "n": j} for j in range(int(mode.split("_")[1]))]
        if mode.startswith("send"):
            outbox.send_many([{"topic": "bench.noop", "payload": p} for p in payloads])
        elif len(payloads) == 1:
            execute(minimal_relay.INSERT_ONE, [json.dumps(payloads[0])])
        else:
            execute(minimal_relay.INSERT_MANY, [[json.dumps(p) for p in payloads]])

    n = max(4, ctx.sizes.send_transactions // 5)
    modes = ("send_1", "send_100", "floor_1", "floor_100")
    ratios = {"ratio": ("send_100", "send_1"), "floor_ratio": ("floor_100", "floor_1")}  # the target: at most 2x
    return {"api": "send_many", "transactions": n, **_figure(_send_reps(ctx, n, write, *modes), modes, "_us", **ratios)}


@dataclass(frozen=True, kw_only=True)
class System:
    """Something that drains a backlog: how to start one worker, see it ready, empty and fill its table."""

    name: str
    start: Callable[[Context], procs.Proc]
    ready: str | Callable[[Context, list[procs.Proc]], None]  # a line each worker prints, or a wait
    reset: tuple[str, ...]
    fill: Callable[[Context, int], float]  # commits a backlog of n; the time after the commit
    busy: str  # whether anything is left to drain
    dsn: Callable[[Context], str] = lambda ctx: ctx.dsn  # where its table is
    setup: Callable[[Context], object] = lambda ctx: None  # makes its tables
    seconds_per_message: float = 0.01  # how long it may take at most (and two minutes)


def _fill(ctx: Context, n: int, *, table: str = tables.MESSAGE, channel: str = "django_outbox") -> float:
    with tables.connect(ctx.dsn) as conn:
        return tables.fill_pending(conn, n, channel=channel, analyze=True, table=table)


def busy_sql(table: str, statuses: str) -> str:
    return f"SELECT EXISTS (SELECT 1 FROM {table} WHERE status IN ({statuses}))"


OUTBOX_RESET = (
    f"TRUNCATE {tables.MESSAGE}, {tables.ATTEMPT} RESTART IDENTITY CASCADE",
    "TRUNCATE django_outbox_worker",
)
OUTBOX_BUSY = busy_sql(tables.MESSAGE, "'pending', 'processing'")
#: The project's table, as a system drains it.
OUTBOX_TABLE: Any = {"reset": OUTBOX_RESET, "fill": _fill, "busy": OUTBOX_BUSY}


def _outbox(name: str, *options: str) -> System:
    """``manage.py outbox_worker`` with batches of 100 and ``options``."""

    def start(ctx: Context) -> procs.Proc:
        return procs.outbox_worker(ctx.dsn, "--batch-size", "100", *options)

    return System(name=name, start=start, ready="relaying", **OUTBOX_TABLE)


def _relay(name: str, *options: str, **table: Any) -> System:
    """The hand-written relay of bench/minimal_relay.py."""
    return System(name=name, start=lambda c: procs.script("minimal_relay.py", c.dsn, *options), ready="ready", **table)


OUTBOX = _outbox("outbox")
#: One delivery thread: what one database connection of the worker drains.
OUTBOX_ONE_THREAD = _outbox("outbox_one_thread", "--concurrency", "1")
#: The same relay as the minimal one, on the project's own table.
BASELINE = _relay("baseline", "--same-table", **OUTBOX_TABLE)
MINIMAL = _relay(
    "minimal",
    reset=(f"TRUNCATE {minimal_relay.TABLE} RESTART IDENTITY",),
    fill=partial(_fill, table=minimal_relay.TABLE, channel="bench_minimal"),
    busy=busy_sql(minimal_relay.TABLE, "'pending', 'processing'"),
)


def _exists(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> bool:
    row = conn.execute(statement).fetchone()
    return bool(row and row[0])


def drain_once(
    ctx: Context, system: System, processes: int, n: int, *, window: float | None = None, hold: bool = False
) -> float:
    """Messages per second for ``processes`` idle workers to drain a backlog of ``n`` committed at once; with a
    ``window``, what they delivered of it in that many seconds (the project's table). ``hold``: another session
    holds an xid from before the backlog's commit to the end, so that vacuum cannot remove what it might see."""
    dsn = system.dsn(ctx)
    with tables.connect(dsn) as conn:
        for statement in system.reset:
            conn.execute(statement)
    started = [system.start(ctx) for _ in range(processes)]
    holder = psycopg.connect(dsn) if hold else None
    try:
        if isinstance(system.ready, str):
            for p in started:
                p.wait_for_line(system.ready)
        else:
            system.ready(ctx, started)
        time.sleep(0.5)  # let them settle into their idle wait
        if holder:
            holder.execute("SELECT txid_current()")
        t0 = system.fill(ctx, n)
        with tables.connect(dsn) as poll:
            if window is not None:
                while time.time() < t0 + window and _exists(poll, system.busy):
                    time.sleep(0.1)
                return tables.count(poll, "delivered") / (time.time() - t0)
            timeout = 120 + n * system.seconds_per_message
            t1 = procs.wait_drained(lambda: not _exists(poll, system.busy), started, f"{system.name} draining", timeout)
    finally:
        procs.stop_all(started)
        if holder:
            holder.close()  # without a commit: rolled back
    return n / (t1 - t0)


def _turns(ctx: Context, label: str, unit: str, runs: Mapping[str, Callable[[], float]]) -> list[Json]:
    """Each of ``runs`` once per repetition, rotated so that each meets the machine's drift in every position."""
    reps: list[Json] = []
    for rep in range(ctx.sizes.reps):
        reps.append({name: runs[name]() for name in common.rotated(list(runs), rep)})
        ctx.log_values(label, reps[-1], unit)
    return reps


def drain(ctx: Context) -> Json:
    """The outbox (two delivery threads per process, its default; with ``one_thread``, at one process also
    one) against both relays with as many processes."""
    ctx.ensure_minimal()
    n = ctx.sizes.drain_messages
    result: Json = {"messages": n, "batch_size": 100, "by_processes": {}}
    for processes in ctx.sizes.drain_processes:
        one_thread = processes == 1 and ctx.sizes.one_thread
        systems = [OUTBOX, *([OUTBOX_ONE_THREAD] if one_thread else []), BASELINE, MINIMAL]
        runs = {s.name: partial(drain_once, ctx, s, processes, n) for s in systems}
        reps = _turns(ctx, f"drain x{processes}", "msg/s", runs)
        figure = result["by_processes"][str(processes)] = _figure(
            reps,
            ("outbox", "baseline", "minimal"),
            "_per_s",
            ratio=("outbox", "minimal"),  # the target: at least 0.5x (aim 0.8x)
            ratio_same_table=("outbox", "baseline"),
            same_table_to_minimal=("baseline", "minimal"),
        )
        if one_thread:
            figure["one_thread_per_s"] = median([r["outbox_one_thread"] for r in reps])
            figure["ratio_one_thread"] = ratio(reps, "outbox_one_thread", "minimal")
    return result


#: Seconds between two sends, drawn at random.
GAP = (0.005, 0.015)
#: The header that makes bench/noop's handler report its start to the harness.
TIMED = {"bench-latency": "1"}
#: The latency figure's messages, in turn: the outbox's keyed and unkeyed, and the minimal relay's rows.
LATENCY_KINDS = ("keyed", "unkeyed", "minimal")


def latency_summary(ms: list[float], sent: int) -> Json:
    return {f"p{q}_ms": common.percentile(ms, q) for q in (50, 95, 99)} | {"received": len(ms), "sent": sent}


def latency_neighbour(ctx: Context) -> Json:
    """Commit to handler, keyed (ten keys) and unkeyed, against the minimal relay woken by a NOTIFY of its own,
    each time also split at COMMIT's return. Phases, rotated every repetition: ``idle``; ``busy``, beside
    bench/neighbour.py's write transactions; ``idle_async``, COMMIT not waiting for the disk (the wake-up alone)."""
    from django.db import transaction

    from django_outbox import outbox

    neighbour_dsn = ctx.beside("_neighbour")
    tables.ensure_database(neighbour_dsn)
    ctx.ensure_minimal()
    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)
        tables.vacuum(conn)
        conn.execute(MINIMAL.reset[0])

    def send(i: int, flush: bool) -> tuple[str, float]:
        """The id of message ``i``, and the time before its COMMIT (which the figures include)."""
        kind = LATENCY_KINDS[i % len(LATENCY_KINDS)]
        with transaction.atomic():
            if not flush:  # this transaction only: COMMIT returns (and NOTIFY goes) before the WAL flush
                execute("SET LOCAL synchronous_commit = off")
            if kind == "minimal":  # the reference: one row into the minimal table, one NOTIFY
                row_id = f"m{common.sql(minimal_relay.INSERT_ONE + ' RETURNING id', [json.dumps({'n': i})])[0][0]}"
                execute("SELECT pg_notify('bench_minimal', '')")
            else:
                key = f"k{i // len(LATENCY_KINDS) % 10}" if kind == "keyed" else None
                row_id = str(outbox.send("bench.latency", {"n": i}, key=key, headers=TIMED).id)
            return row_id, time.time()

    def phase(arrived: dict[str, float], name: str) -> Json:
        neighbour = procs.script("neighbour.py", neighbour_dsn) if name == "busy" else None
        sent: dict[str, tuple[int, float, float]] = {}  # per id: i, the times before and after COMMIT
        try:
            if neighbour:
                neighbour.wait_for_line("ready")
                time.sleep(0.3)
            arrived.clear()
            for i in range(ctx.sizes.latency_messages):
                row_id, before = send(i, name != "idle_async")
                sent[row_id] = (i, before, time.time())
                time.sleep(random.uniform(*GAP))
            procs.wait_for_all(arrived, sent, 15)
        finally:
            if neighbour:
                neighbour.stop()
        result: Json = {"lost": sum(1 for k in sent if k not in arrived)}
        if neighbour:
            ran = [line for line in neighbour.lines if line.startswith("transactions ")]
            result["neighbour_transactions"] = int(ran[-1].split()[1]) if ran else 0
        for j, kind in enumerate(LATENCY_KINDS):
            mine = [(before, after, arrived.get(k)) for k, (i, before, after) in sent.items() if i % 3 == j]
            spans = {  # commit to handler; COMMIT's own round trip (the WAL flush); from its return on
                "": [got - before for before, _, got in mine if got],
                "commit_": [after - before for before, after, _ in mine],
                "after_commit_": [got - after for _, after, got in mine if got],
            }
            result[kind] = {
                f"{span}p{q}_ms": common.percentile(v, q) * 1000 for span, v in spans.items() for q in (50, 99)
            }
        ctx.log_values(f"latency {name}", {k: result[k]["p50_ms"] for k in LATENCY_KINDS}, "ms p50")
        return result

    phases = ("idle", "busy", "idle_async")
    with procs.udp_receiver() as (port, arrived):  # the handlers' start times, by id, as they arrive
        env = {"BENCH_UDP_PORT": str(port), "BENCH_POLL_INTERVAL": "1.0"}
        args = ("--listen", "bench_minimal", "--udp-port", str(port))
        workers = [procs.outbox_worker(ctx.dsn, env=env), procs.script("minimal_relay.py", ctx.dsn, *args)]
        try:
            for worker, ready in zip(workers, ("relaying", "ready"), strict=True):
                worker.wait_for_line(ready)
            time.sleep(1.0)
            reps = [{p: phase(arrived, p) for p in common.rotated(phases, rep)} for rep in range(ctx.sizes.reps)]
        finally:
            procs.stop_all(workers)
    out: Json = {"messages_per_phase": ctx.sizes.latency_messages, "reps": reps}
    for p in phases:
        of = [r[p] for r in reps]
        out[p] = {"lost": sum(r["lost"] for r in of)}
        out[p] |= {k: {q: median([r[k][q] for r in of]) for q in of[0][k]} for k in LATENCY_KINDS}
        for name, kind, reference, q in (
            ("unkeyed_p50_to_minimal", "unkeyed", "minimal", "p50_ms"),
            ("keyed_p50_ratio", "keyed", "unkeyed", "p50_ms"),
            ("keyed_p99_ratio", "keyed", "unkeyed", "p99_ms"),
        ):
            out[p][name] = median([r[kind][q] / r[reference][q] if r[reference][q] > 0 else float("nan") for r in of])
    # the targets: idle p50 <= 2 ms, p99 <= 5 ms; busy keyed p50 <= 2x, p99 <= 3x unkeyed
    return out


def _producers(ctx: Context, modes: tuple[str, ...], **ratios: tuple[str, str]) -> Json:
    """Per producer count, transactions per second of each mode of bench/producer.py and the named ratios."""
    ctx.ensure_minimal()  # the producers' warm-up writes to the minimal table
    return {"by_producers": {str(n): _producer_rounds(ctx, n, modes, ratios) for n in ctx.sizes.enqueue_producers}}


def _producer_rounds(ctx: Context, producers: int, modes: Sequence[str], ratios: Mapping[str, tuple[str, str]]) -> Json:
    """The producers start once (start-up is not timed); each round, released to all at once by a file that
    names its mode, runs ``per`` transactions in each."""
    per = max(4, ctx.sizes.enqueue_transactions // producers)
    with tempfile.TemporaryDirectory(prefix="bench-producers-") as go:
        started = [procs.script("producer.py", go, str(per), env={"DATABASE_URL": ctx.dsn}) for _ in range(producers)]
        rounds = itertools.count()

        def release(mode: str) -> float:
            number, t0 = next(rounds), time.monotonic()
            Path(go, "next").write_text(mode)
            os.replace(Path(go, "next"), Path(go, f"go-{number}"))  # whole, or not there yet
            for p in started:
                p.wait_for_line(f"done {number} ", timeout=300)
            return producers * per / (time.monotonic() - t0)

        try:
            for p in started:
                p.wait_for_line("ready", timeout=180)
            reps = _turns(ctx, f"producers x{producers}", "tx/s", {m: partial(release, m) for m in modes})
        finally:
            procs.stop_all(started)
    return {"transactions_per_producer": per, **_figure(reps, modes, "_per_s", **ratios)}


#: ``send()`` against the floor (the same transaction plus one hand-written INSERT into the minimal table),
#: NOTIFY on (the floor with ``pg_notify``) and off.
enqueue = partial(
    _producers,
    modes=("send", "floor_notify", "send_quiet", "floor"),
    ratio_notify=("send", "floor_notify"),
    ratio_quiet=("send_quiet", "floor"),
)
#: Keyed ``send()`` against unkeyed, NOTIFY off: ``key_many`` a key per transaction (the locks' cost),
#: ``key_one`` every producer on one key (they queue for its lock).
keyed_producers = partial(
    _producers,
    modes=("send_quiet", "key_many", "key_one"),
    ratio_key_many=("key_many", "send_quiet"),
    ratio_key_one=("key_one", "send_quiet"),
)


def claim_cost(ctx: Context) -> Json:
    """ms per claim of 100 messages and per record of their outcomes, with a small and a large history, in
    units of the reference: 100 rows of history fetched by primary key, one statement on the same connection.
    The claim and the reference alternate which goes first; a record that fails is a finding, not timed."""
    from django.db import DatabaseError, connections
    from django.utils import timezone

    from django_outbox import store

    def reference(times: dict[str, list[float]], history: int) -> None:
        ids = random.sample(range(1, history + 1), min(100, history))
        started = time.perf_counter()
        common.sql(
            f"SELECT id, uuid, topic, key, payload, headers, attempts FROM {tables.MESSAGE} WHERE id = ANY(%s)", [ids]
        )
        times["reference_ms"].append(time.perf_counter() - started)

    def claim_and_record(times: dict[str, list[float]], errors: list[str]) -> None:
        t = time.perf_counter()
        batch = store.claim("default", worker="bench", limit=100, lease_seconds=60)
        times["claim_ms"].append(time.perf_counter() - t)
        now = timezone.now()
        outcomes = [
            store.Outcome(message_id=m.id, number=m.attempts, status=store.DELIVERED, started_at=now, finished_at=now)
            for m in batch
        ]
        t = time.perf_counter()
        try:
            store.record("default", worker="bench", outcomes=outcomes)
            times["record_ms"].append(time.perf_counter() - t)
        except DatabaseError as exc:
            errors.append(str(exc).strip())

    batches = ctx.sizes.claim_batches
    per_size: Json = {}
    for label, history in (("small", ctx.sizes.history_small), ("large", ctx.sizes.history_large)):
        with tables.connect(ctx.dsn) as conn:
            tables.truncate(conn)
            ctx.log(f"  filling {history:,} rows of history ...")
            tables.fill_history(conn, history)
            conn.execute(tables.PENDING, {"n": 100 * (batches * ctx.sizes.reps + 6)})
            tables.vacuum(conn)
            conn.execute("CHECKPOINT")  # the fill's pages written out now, not while the claims are timed
        errors: list[str] = []
        connections["default"].close()
        for _ in range(6):  # warm-up: connection, catalog caches, the prepared statements
            claim_and_record(defaultdict(list), errors)
        reps: list[Json] = []
        for _ in range(ctx.sizes.reps):
            times: dict[str, list[float]] = defaultdict(list)
            steps = [partial(claim_and_record, times, errors), partial(reference, times, history)]
            for i in range(batches):  # the claim and the reference alternate which goes first
                for step in common.rotated(steps, i):
                    step()
            reps.append({k: median(v) * 1000 for k, v in times.items()})
            reps[-1]["claim_over_reference"] = reps[-1]["claim_ms"] / reps[-1]["reference_ms"]
            ctx.log_values(f"{history:,} rows of history", reps[-1], "ms")
        per_size[label] = {"history_rows": history, **medians(reps, list(reps[0])), "reps": reps}
        per_size[label] |= {"record_errors": sorted(set(errors))} if errors else {}
    ratios = {  # large / small
        "ratio": "claim_over_reference",  # the target: at most 1.1x
        "raw_ratio": "claim_ms",
        "reference_ratio": "reference_ms",
        "record_ratio": "record_ms",
    }
    return per_size | {name: per_size["large"][key] / per_size["small"][key] for name, key in ratios.items()}


def open_transaction(ctx: Context, *, expected_rate: float) -> Json:
    """One worker's rate while another session holds a transaction open from before the backlog's commit to
    the window's end, against none; the backlog lasts about the window at b's rate."""
    window = ctx.sizes.open_tx_seconds
    backlog = int(min(400_000, max(1000, expected_rate * window)))
    runs = {m: partial(drain_once, ctx, OUTBOX, 1, backlog, window=window, hold=m == "held") for m in ("held", "free")}
    reps = _turns(ctx, f"open transaction ({window:.0f}s)", "msg/s", runs)
    figure = _figure(reps, ("free", "held"), "_per_s", ratio=("held", "free"))
    return {"window_s": window, "backlog": backlog, **figure, "drop_percent": (1 - figure["ratio"]) * 100}


def memory(ctx: Context) -> Json:
    """RSS of one worker (``--until-empty``) over the relaying of a large backlog, sampled every 0.25 s with
    the count of its last progress line (one every 2 s); the reference is its RSS once a tenth is relayed."""
    n = ctx.sizes.memory_messages
    with tables.connect(ctx.dsn) as conn:
        tables.truncate(conn)
        ctx.log(f"  filling {n:,} pending messages ...")
        for start in range(0, n, 100_000):
            conn.execute(tables.PENDING, {"n": min(100_000, n - start)})
        tables.vacuum(conn)
    worker = procs.outbox_worker(ctx.dsn, "--until-empty", "--batch-size", "100")  # unbuffered (procs.Proc)
    samples: list[tuple[float, int, int]] = []  # (seconds, delivered so far, RSS KiB)
    t0 = time.monotonic()
    delivered = 0
    try:
        while worker.alive():
            progress = [line for line in worker.lines[-5:] if line.startswith("delivered ")]
            delivered = int(progress[-1].split()[1]) if progress else delivered
            try:
                rss = worker.rss_kib()  # 0: exited, not yet reaped
            except FileNotFoundError:  # exited and reaped
                break
            if not rss:
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

    return {
        "messages": n,
        "seconds": time.monotonic() - t0,
        "rate_first_quarter_per_s": rate(0.0, 0.25),
        "rate_last_quarter_per_s": rate(0.75, 1.0),
        "rss_after_warmup_kib": after_warm,
        "rss_final_kib": final,
        "rss_max_kib": max((s[2] for s in samples), default=0),
        "growth_percent": (final / after_warm - 1) * 100 if after_warm else float("nan"),
        "samples": samples,
    }


def _peer(name: str, module: str, worker: str, settings: str = "", **kw: Any) -> System:
    """A peer library, run by the comparison environment's python (``--compare-python``): its worker,
    ``python -m <worker>``, and ``python -m bench.compare.<module> migrate|fill N`` (bench/compare)."""

    def env(c: Context) -> dict[str, str]:
        env = {"BENCH_COMPARE_DSN": c.beside("_compare"), "PYTHONPATH": str(procs.ROOT), "BENCH_TASKS_SYSTEM": name}
        return env | ({"DJANGO_SETTINGS_MODULE": settings} if settings else {})

    def python(c: Context, *args: str) -> list[str]:
        assert c.compare_python is not None
        return [c.compare_python, "-m", *args]

    return System(
        name=name,
        start=lambda c: procs.Proc(python(c, *worker.split()), env=env(c)),
        setup=lambda c: procs.last_line(python(c, f"bench.compare.{module}", "migrate"), env=env(c)),
        fill=lambda c, n: float(procs.last_line(python(c, f"bench.compare.{module}", "fill", str(n)), env=env(c))),
        dsn=lambda c: c.beside("_compare"),
        **kw,
    )


def _procrastinate_ready(c: Context, started: list[procs.Proc]) -> None:
    with psycopg.connect(c.beside("_compare"), autocommit=True) as conn:
        count = lambda: conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone() or (0,)  # noqa: E731
        started[0].wait_for(lambda: int(str(count()[0])) >= len(started), "workers registered")


PEERS = (
    _peer(
        "procrastinate",
        "procrastinate_app",
        "procrastinate --app=bench.compare.procrastinate_app.app worker --queues=bench --concurrency=1",
        ready=_procrastinate_ready,
        reset=("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE",),
        busy=busy_sql("procrastinate_jobs", "'todo', 'doing'"),
    ),
    _peer(
        "django-tasks-db",
        "tasks_peer",
        "django db_worker --interval 0.1 --no-startup-delay --no-reload",
        settings="bench.compare.tasks_settings",
        ready="Starting worker",
        reset=("TRUNCATE django_tasks_database_dbtaskresult",),
        busy=busy_sql("django_tasks_database_dbtaskresult", "'READY', 'RUNNING'"),
    ),
    _peer(
        "pgqueuer",
        "pgqueuer_app",
        "bench.compare.pgqueuer_app worker",
        ready="ready",
        reset=("TRUNCATE pgqueuer, pgqueuer_log",),
        busy=busy_sql("pgqueuer", "'queued', 'picked'"),
    ),
    _peer(
        "django-jaiminho",
        "tasks_peer",
        "django events_relay --run-in-loop --loop-interval 0.1",
        settings="bench.compare.jaiminho_settings",
        ready="stream:",
        reset=("TRUNCATE jaiminho_event",),
        busy="SELECT EXISTS (SELECT 1 FROM jaiminho_event WHERE sent_at IS NULL)",
    ),
)


def compare(ctx: Context, reference: Json) -> Json:
    """Drain rate of other Python queues with a no-op job, against the minimal relay of this run's drain."""
    if not ctx.compare_python:
        ctx.notes.append("comparisons skipped: no --compare-python (see docs/performance.md)")
        return {}
    tables.ensure_database(ctx.beside("_compare"))
    result: Json = {"messages": ctx.sizes.compare_messages}
    for system in PEERS:
        try:
            system.setup(ctx)
        except RuntimeError as exc:  # not installed in the comparison environment: say so, measure the rest
            ctx.notes.append(f"{system.name} skipped: {str(exc).splitlines()[-1]}")
            continue
        by = result[system.name] = {}
        for processes in ctx.sizes.drain_processes:
            rates = [drain_once(ctx, system, processes, ctx.sizes.compare_messages) for _ in range(ctx.sizes.reps)]
            minimal = reference.get("by_processes", {}).get(str(processes), {}).get("minimal_per_s")
            rate = median(rates)
            by[str(processes)] = {"per_s": rate, "ratio_to_minimal": rate / minimal if minimal else None, "reps": rates}
            ctx.log(f"  {system.name} x{processes}: {rate:,.0f}/s")
    return result


#: Server settings that move the figures, recorded with every run.
SERVER_SETTINGS = ("server_version", "autovacuum", "synchronous_commit", "fsync", "shared_buffers", "max_wal_size")


def environment(dsn: str) -> Json:
    import django

    info: Json = {
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }
    models = [line for line in open("/proc/cpuinfo").read().splitlines() if line.startswith("model name")]
    info |= {"cpu": models[0].split(":", 1)[1].strip()} if models else {}
    with tables.connect(dsn) as conn:
        info["postgresql"] = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SERVER_SETTINGS}  # type: ignore[index]
    return info
