"""The table of docs/performance.md, written from a results file of ``bench/run.py``.

    python bench/table.py [RESULTS.json ...]

One row per figure: the outbox, its reference in the same run, the ratio, the section that measures it.
A later file's sections replace an earlier one's (a section re-run alone after a fix of its measurement).
A section the run did not measure, or whose script failed before writing the figures a row needs, gives
no row: the table says what was measured.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Json = dict[str, Any]
Row = tuple[str, str, str, str]
HEADER = ("figure", "the outbox", "the reference, same run", "ratio")


def n(value: float) -> str:
    return f"{value:,.0f}"


def x(value: float) -> str:
    return f"{value:.2f}x"


def slash(values: Any, fmt: Callable[[float], str] = n) -> str:
    return " / ".join(fmt(v) for v in values)


def med(values: list[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def size(section: str, mode: str, flag: str) -> int:
    """An argument the harness gave a script section in this mode (``SCRIPTS``), for a row's wording."""
    from bench.run import SCRIPTS

    words = shlex.split(getattr(SCRIPTS[section], mode))
    return int(words[words.index(flag) + 1])


def send(f: Json, mode: str) -> Iterator[Row]:
    s, b = f["send"], f["send_batch"]
    yield (
        "`send()` in a one-row business transaction",
        f"{n(s['send_us_per_tx'])} µs",
        f"the floor: the same transaction plus one `INSERT` into a minimal table, {n(s['minimal_us_per_tx'])} µs",
        f"**{x(s['ratio_to_floor'])}** (NOTIFY off {x(s['ratio_to_floor_no_notify'])})",
    )
    yield (
        f"100 messages in one transaction (`{b['api']}()`) against one",
        f"{n(b['send_100_us'])} against {n(b['send_1_us'])} µs",
        f"the floor: one `INSERT` of 100 rows against one, {n(b['floor_100_us'])} against {n(b['floor_1_us'])} µs",
        f"{x(b['ratio'])} (the floor: {x(b['floor_ratio'])})",
    )


KINDS = ("unkeyed", "idempotent", "keyed")


def send_many(f: Json, mode: str) -> Iterator[Row]:
    s = f["send_many"]
    pg = s["postgresql"]
    yield (
        f"`send_many()` of {n(s['items'])} items (keyed: {n(s['keyed_items'])} keys)",
        f"{slash(pg['per_s'][k] for k in KINDS)} msg/s (unkeyed / idempotency keys / keyed)",
        f"one hand-written multi-row `INSERT` into a minimal table: {n(pg['per_s']['reference'])} msg/s",
        slash((pg["vs_reference"][k] for k in KINDS), x),
    )


def send_many_mariadb(f: Json, mode: str) -> Iterator[Row]:
    s = f["send_many"]
    yield (
        "MariaDB `send_many()`, the same items",
        f"{slash(s['mariadb']['per_s'][k] for k in KINDS)} msg/s",
        "PostgreSQL's `send_many()` in the same run",
        slash((s["mariadb_vs_postgresql"][k] for k in KINDS), x),
    )


def drain(f: Json, mode: str) -> Iterator[Row]:
    d = f["drain"]
    by = d["by_processes"]
    yield (
        f"drain, {slash(by, str)} worker processes, {n(d['messages'])} messages",
        f"{slash(p['outbox_per_s'] for p in by.values())} msg/s",
        f"the hand-written relay on a minimal table: {slash(p['minimal_per_s'] for p in by.values())} msg/s",
        f"**{slash((p['ratio'] for p in by.values()), x)}** (of the same relay on the project's table: "
        f"{slash((p['ratio_same_table'] for p in by.values()), x)})",
    )


def latency(f: Json, mode: str) -> Iterator[Row]:
    idle, busy = f["latency_neighbour"]["idle"], f["latency_neighbour"]["busy"]
    u, m, k, bu = idle["unkeyed"], idle["minimal"], busy["keyed"], busy["unkeyed"]
    yield (
        "commit to handler, idle worker, PostgreSQL `NOTIFY`",
        f"p50 {u['p50_ms']:.1f} / p99 {u['p99_ms']:.1f} ms",
        f"the hand-written relay woken by its own `NOTIFY`: p50 {m['p50_ms']:.1f} / p99 {m['p99_ms']:.1f} ms",
        f"p50 {x(idle['unkeyed_p50_to_minimal'])}",
    )
    yield (
        "the same, keyed, a busy neighbour database on the server",
        f"p50 {k['p50_ms']:.1f} / p99 {k['p99_ms']:.1f} ms",
        f"unkeyed, same phase: p50 {bu['p50_ms']:.1f} / p99 {bu['p99_ms']:.1f} ms",
        f"{x(busy['keyed_p50_ratio'])} / {x(busy['keyed_p99_ratio'])}",
    )


def enqueue(f: Json, mode: str) -> Iterator[Row]:
    by = f["enqueue"]["by_producers"]
    e = list(by.values())
    yield (
        f"enqueue: {slash(by, str)} producer processes, NOTIFY on",
        f"{slash(p['send_per_s'] for p in e)} tx/s",
        f"the floor plus `pg_notify`: {slash(p['floor_notify_per_s'] for p in e)} tx/s",
        slash((p["ratio_notify"] for p in e), x),
    )
    yield (
        "the same, NOTIFY off",
        f"{slash(p['send_quiet_per_s'] for p in e)} tx/s",
        f"the floor: {slash(p['floor_per_s'] for p in e)} tx/s",
        slash((p["ratio_quiet"] for p in e), x),
    )


def keyed(f: Json, mode: str) -> Iterator[Row]:
    by = f["keyed"]["by_producers"]
    k = list(by.values())
    yield (
        f"keyed producers, {slash(by, str)} processes: each on a key of its own; all on one key",
        f"{slash(p['key_many_per_s'] for p in k)}; {slash(p['key_one_per_s'] for p in k)} tx/s",
        f"unkeyed producers: {slash(p['send_quiet_per_s'] for p in k)} tx/s",
        f"{slash((p['ratio_key_many'] for p in k), x)}; {slash((p['ratio_key_one'] for p in k), x)}",
    )


def keyed_drain(f: Json, mode: str) -> Iterator[Row]:
    kd = f["keyed_drain"]
    messages = kd.get("messages") or size("keyed_drain", mode, "--messages")
    for vendor, name in (("postgresql", "PostgreSQL"), ("mysql", "MariaDB")):
        if vendor not in kd:
            continue
        d = kd[vendor]
        keys = [k for k in d["rates"] if k != "0"]
        yield (
            f"keyed drain on {name}, {n(messages)} messages over {slash(int(k) for k in keys)} keys,"
            f" {kd.get('processes', 2)} processes",
            f"{slash(med(d['rates'][k]) for k in keys)} msg/s",
            f"the unkeyed drain of the same run: {n(med(d['rates']['0']))} msg/s",
            slash((med(d["ratios"][k]) for k in keys), x),
        )
        if len(d["claim_cost_s"]) < 2:
            continue
        (small, cost_small), (large, cost_large) = list(d["claim_cost_s"].items())[:2]
        yield (
            f"a claim of 100 on {name}, {n(int(small))} then {n(int(large))} pending on 5 keys",
            f"{ms(cost_small)} then {ms(cost_large)} ms",
            "",
            f"{x(cost_large / cost_small)} for ten times the backlog",
        )


def scale(f: Json, mode: str) -> Iterator[Row]:
    c = f["claim_cost"]
    s, b = c["small"], c["large"]
    yield (
        f"claim of 100, {n(s['history_rows'])} then {n(b['history_rows'])} rows of history",
        f"{s['claim_ms']:.2f} then {b['claim_ms']:.2f} ms ({x(c['raw_ratio'])})",
        f"100 rows by primary key from the same table: {s['reference_ms']:.2f} then {b['reference_ms']:.2f} ms"
        f" ({x(c['reference_ratio'])})",
        f"{x(c['ratio'])}, in units of the reference",
    )


def opentx(f: Json, mode: str) -> Iterator[Row]:
    o = f["open_transaction"]
    yield (
        f"drain while a transaction stays open elsewhere for {o['window_s']:.0f} s",
        f"{n(o['held_per_s'])} msg/s",
        f"the same drain without it: {n(o['free_per_s'])} msg/s",
        x(o["ratio"]),
    )


def memory(f: Json, mode: str) -> Iterator[Row]:
    m = f["memory"]
    yield (
        f"worker memory (RSS) over {n(m['messages'])} messages",
        f"{m['rss_final_kib'] / 1024:.1f} MiB at the end",
        f"{m['rss_after_warmup_kib'] / 1024:.1f} MiB a fifth of the way in",
        f"{m['growth_percent']:+.1f}%",
    )


def compare(f: Json, mode: str) -> Iterator[Row]:
    c = f["compare"]
    peers = {name: by for name, by in c.items() if isinstance(by, dict)}
    if not peers:
        return
    ratios = [p["ratio_to_minimal"] for by in peers.values() for p in by.values() if p["ratio_to_minimal"]]
    counts = next(iter(peers.values()))
    drain = f.get("drain", {}).get("by_processes", {})
    yield (
        f"peers, drain with {slash(counts, str)} processes, {n(c['messages'])} jobs (jobs/s)",
        "; ".join(f"{name} {slash(p['per_s'] for p in by.values())}" for name, by in peers.items()),
        "the hand-written relay of the drain row",
        f"{min(ratios):.3f}x to {max(ratios):.3f}x (the outbox: {slash((p['ratio'] for p in drain.values()), x)})"
        if ratios and drain
        else "the drain section did not run",
    )


def mariadb(f: Json, mode: str) -> Iterator[Row]:
    d, s = f["mariadb"]["drain"], f["mariadb"]["send"]
    by = d["by_processes"]
    yield (
        f"MariaDB drain, {slash(by, str)} worker processes, {n(d['messages'])} messages",
        f"{slash(p['outbox_per_s'] for p in by.values())} msg/s",
        f"the two-statement relay on a twin table: {slash(p['reference_per_s'] for p in by.values())} msg/s",
        f"**{slash((p['ratio'] for p in by.values()), x)}**",
    )
    yield (
        "MariaDB `send()` in a one-row business transaction",
        f"{n(s['send_us_per_tx'])} µs",
        f"the floor, {n(s['floor_us_per_tx'])} µs",
        f"**{x(s['send_vs_floor'])}** (keyed {x(s['send_keyed_vs_floor_keyed'])})",
    )


BROKERS = {"rabbitmq": "RabbitMQ", "redis": "Redis Streams", "nats": "NATS JetStream", "kafka": "Kafka"}


def brokers(f: Json, mode: str) -> Iterator[Row]:
    b = f["brokers"]
    by = {r["destination"]: r for r in b["results"]}
    names = [d for d in BROKERS if d in by]
    yield (
        f"to {' / '.join(BROKERS[d] for d in names)}, one thread, {n(b['messages'])} messages",
        f"{slash(by[d]['median_rate'] for d in names)} msg/s",
        f"a no-op handler, {n(by['noop']['median_rate'])} msg/s",
        slash((by[d]["median_rate"] / by["noop"]["median_rate"] for d in names), x),
    )
    if "kafka" in by and "kafka-ref" in by:
        yield (
            "the Kafka transport",
            f"{n(by['kafka']['median_rate'])} msg/s",
            f"a hand-written confluent-kafka loop: {n(by['kafka-ref']['median_rate'])} msg/s",
            f"**{x(by['kafka']['median_rate'] / by['kafka-ref']['median_rate'])}**",
        )


def topology(f: Json, mode: str) -> Iterator[Row]:
    t = f["topology"]["figures"]
    drains = t["drain"]["by_processes"]
    lat, direct = t["latency"]["transaction_listen"], t["latency"]["direct"]
    yield (
        "behind PgBouncer, transaction pooling, `LISTEN_DATABASE` set",
        f"drain {slash((p['transaction_listen']['ratio'] for p in drains.values()), x)} of direct"
        f" ({slash(drains, str)} processes); p50 {lat['p50_ms']:.1f} ms",
        f"direct connections: p50 {direct['p50_ms']:.1f} ms",
        f"p50 {x(lat['p50_ratio_to_direct'])}",
    )


def stop(f: Json, mode: str) -> Iterator[Row]:
    s = f["stop"]["postgresql"]
    yield (
        "an idle worker's exit on SIGTERM",
        f"{s['worker_s']:.2f} s",
        f"a bare management command: {s['reference_s']:.2f} s",
        x(s["ratio"]),
    )


def migrations(f: Json, mode: str) -> Iterator[Row]:
    for vendor, name in (("postgresql", "PostgreSQL"), ("mysql", "MariaDB")):
        for rows, variants in f["migrations"].get(vendor, {}).items():
            runs = variants["package"]
            steps = list(runs[0]["steps"])
            longest = {step: med([r["steps"][step]["longest_send_s"] for r in runs]) for step in steps}
            floor = med([step["floor_s"] for r in runs for step in r["steps"].values()])
            yield (
                f"the longest `send()` while this release's migrations run on {name}, {n(int(rows))} rows,"
                " workers draining",
                "; ".join(f"`{step}` {s * 1000:.0f} ms" for step, s in longest.items()),
                f"the longest `send()` with no migration running: {floor * 1000:.0f} ms",
                "",
            )


def autovacuum(f: Json, mode: str) -> Iterator[Row]:
    a = f["autovacuum"]
    tuned = next(r for r in a["results"] if r["tuned"])
    default = next(r for r in a["results"] if not r["tuned"])
    yield (
        f"dead row versions under a steady producer, {n(a['args']['history'])} rows of history",
        f"the migration's settings: median {n(tuned['dead_median'])}",
        f"PostgreSQL's defaults: {n(default['dead_median'])}",
        f"the claim's walk: {tuned['walk_pages_median']:.0f} page against {default['walk_pages_median']:.0f}",
    )


def admin(f: Json, mode: str) -> Iterator[Row]:
    a = f["admin"]
    slowest = max(a["pages"], key=lambda page: a["pages"][page]["median_ms"])
    scans = sum(p["sequential_scans"] for p in a["pages"].values())
    yield (
        f"the admin at {n(a['rows'])} rows: every list, filter, search, detail and the overview",
        f"slowest median {a['pages'][slowest]['median_ms']:.0f} ms ({slowest});"
        f" at most {max(p['queries'] for p in a['pages'].values())} queries a page",
        "no sequential scan of the message table",
        f"{scans} sequential scans",
    )


def tasks(f: Json, mode: str) -> Iterator[Row]:
    t = f["tasks"]
    runs = [t[k] for k in sorted((k for k in t if k.startswith("x")), key=lambda k: int(k[1:]))]
    counts = " / ".join(k[1:] for k in sorted((k for k in t if k.startswith("x")), key=lambda k: int(k[1:])))
    yield (
        f"Django tasks (`django_outbox.tasks.OutboxBackend`), {counts} worker processes",
        f"{slash(r['per_s']['outbox-tasks'] for r in runs)} tasks/s",
        f"django-tasks-db's `db_worker`: {slash(r['per_s']['django-tasks-db'] for r in runs)} tasks/s",
        slash((r["ratio_outbox_to_peer"] for r in runs), lambda v: f"{v:.1f}x"),
    )


def observability(f: Json, mode: str) -> Iterator[Row]:
    o = f["observability"]["fastest_us"]
    yield (
        "`send()` without opentelemetry installed",
        f"{n(o['without'])} µs (fastest round)",
        f"`send()` without the tracing hook: {n(o['reference'])} µs",
        x(o["without"] / o["reference"]),
    )


def chaos(f: Json, mode: str) -> Iterator[Row]:
    c = f["chaos"]
    exact = c["effects applied more than once"] == 0 and c["effects lost"] == 0
    yield (
        "the chaos run: killed workers and consumers, a database restart, a broker outage",
        f"{n(c['sent (committed)'])} committed: {c['lost']} lost, {c['duplicates unexplained']} unexplained"
        f" duplicates, {c['keys delivered out of order']} keys out of order",
        "its audit",
        "every effect applied exactly once" if exact else "effects applied twice or lost: see the JSON",
    )


#: (section, the figures it needs, its rows), in the order of the docs' table.
ROWS: tuple[tuple[str, tuple[str, ...], Callable[[Json, str], Iterator[Row]]], ...] = (
    ("send", ("send", "send_batch"), send),
    ("send_many", ("send_many",), send_many),
    ("drain", ("drain",), drain),
    ("latency", ("latency_neighbour",), latency),
    ("enqueue", ("enqueue",), enqueue),
    ("keyed", ("keyed",), keyed),
    ("keyed_drain", ("keyed_drain",), keyed_drain),
    ("scale", ("claim_cost",), scale),
    ("opentx", ("open_transaction",), opentx),
    ("memory", ("memory",), memory),
    ("compare", ("compare",), compare),
    ("mariadb", ("mariadb",), mariadb),
    ("send_many", ("send_many",), send_many_mariadb),
    ("brokers", ("brokers",), brokers),
    ("topology", ("topology",), topology),
    ("stop", ("stop",), stop),
    ("migrations", ("migrations",), migrations),
    ("autovacuum", ("autovacuum",), autovacuum),
    ("admin", ("admin",), admin),
    ("tasks", ("tasks",), tasks),
    ("observability", ("observability",), observability),
    ("chaos", ("chaos",), chaos),
)


def render(results: Json) -> str:
    f, mode = results["figures"], results["mode"]
    lines = ["| " + " | ".join((*HEADER, "section")) + " |", "|" + " --- |" * (len(HEADER) + 1)]
    for section, needs, rows in ROWS:
        if not all(isinstance(f.get(k), dict) for k in needs):
            continue
        try:
            made = list(rows(f, mode))
        except KeyError:  # a script that failed part-way: its JSON lacks what the row states
            continue
        lines += ["| " + " | ".join((*row, f"`{section}`")) + " |" for row in made]
    return "\n".join(lines)


def merged(paths: list[Path]) -> Json:
    results: Json = json.loads(paths[0].read_text())
    for path in paths[1:]:
        results["figures"].update(json.loads(path.read_text())["figures"])
    return results


if __name__ == "__main__":
    print(render(merged([Path(p) for p in sys.argv[1:]])))
