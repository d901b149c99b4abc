"""The table of docs/performance.md, written from a results file of ``bench/run.py``.

    python bench/table.py [RESULTS.json ...]

A later file's sections replace an earlier one's (a section re-run alone after a fix of its measurement). A
section the run did not measure, or whose script failed before writing the figures a row needs, gives no row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

Json = dict[str, Any]
Row = tuple[str, str, str, str]
Rows = Callable[[Json], Iterator[Row]]
HEADER = ("figure", "the outbox", "the reference, same run", "ratio", "section")
KINDS = ("unkeyed", "idempotent", "keyed")
VENDORS = {"postgresql": "PostgreSQL", "mysql": "MariaDB"}
BROKERS = {"rabbitmq": "RabbitMQ", "redis": "Redis Streams", "nats": "NATS JetStream", "kafka": "Kafka"}


def n(value: float) -> str:
    return f"{value:,.0f}"


def x(value: float) -> str:
    return f"{value:.2f}x"


def slash(values: Any, fmt: Callable[[float], str] = n) -> str:
    return " / ".join(fmt(v) for v in values)


def each(by: Json, key: str, fmt: Callable[[float], str] = n) -> str:
    """``key`` of every run of ``by`` (by process or producer count), as "a / b / c"."""
    return slash((p[key] for p in by.values()), fmt)


def cells(section: str, key: str) -> Callable[..., tuple[str, Rows]]:
    """``cells(section, key)(figure, outbox, reference, ratio)``: a row of format strings filled from the figures
    under ``key`` (``{idle[unkeyed][p50_ms]:.1f}``)."""

    def filled(*templates: str) -> tuple[str, Rows]:
        def row(f: Json) -> Iterator[Row]:
            yield tuple(template.format_map(f[key]) for template in templates)  # type: ignore[misc]

        return section, row

    return filled


def send_many(f: Json) -> Iterator[Row]:
    s = f["send_many"]
    pg = s["postgresql"]
    yield (
        f"`send_many()` of {n(s['items'])} items (keyed: {n(s['keyed_items'])} keys)",
        f"{slash(pg['per_s'][k] for k in KINDS)} msg/s (unkeyed / idempotency keys / keyed)",
        f"one hand-written multi-row `INSERT` into a minimal table: {n(pg['per_s']['reference'])} msg/s",
        slash((pg["vs_reference"][k] for k in KINDS), x),
    )


def send_many_mariadb(f: Json) -> Iterator[Row]:
    s = f["send_many"]
    yield (
        "MariaDB `send_many()`, the same items",
        f"{slash(s['mariadb']['per_s'][k] for k in KINDS)} msg/s",
        "PostgreSQL's `send_many()` in the same run",
        slash((s["mariadb_vs_postgresql"][k] for k in KINDS), x),
    )


def drain(f: Json) -> Iterator[Row]:
    d = f["drain"]
    by = d["by_processes"]
    yield (
        f"drain, {slash(by, str)} worker processes, {n(d['messages'])} messages",
        f"{each(by, 'outbox_per_s')} msg/s",
        f"the hand-written relay on a minimal table: {each(by, 'minimal_per_s')} msg/s",
        f"**{each(by, 'ratio', x)}** (of the same relay on the project's table: {each(by, 'ratio_same_table', x)})",
    )


def enqueue(f: Json) -> Iterator[Row]:
    by = f["enqueue"]["by_producers"]
    yield (
        f"enqueue: {slash(by, str)} producer processes, NOTIFY on",
        f"{each(by, 'send_per_s')} tx/s",
        f"the floor plus `pg_notify`: {each(by, 'floor_notify_per_s')} tx/s",
        each(by, "ratio_notify", x),
    )
    yield (
        "the same, NOTIFY off",
        f"{each(by, 'send_quiet_per_s')} tx/s",
        f"the floor: {each(by, 'floor_per_s')} tx/s",
        each(by, "ratio_quiet", x),
    )


def keyed(f: Json) -> Iterator[Row]:
    by = f["keyed"]["by_producers"]
    yield (
        f"keyed producers, {slash(by, str)} processes: each on a key of its own; all on one key",
        f"{each(by, 'key_many_per_s')}; {each(by, 'key_one_per_s')} tx/s",
        f"unkeyed producers: {each(by, 'send_quiet_per_s')} tx/s",
        f"{each(by, 'ratio_key_many', x)}; {each(by, 'ratio_key_one', x)}",
    )


def keyed_drain(f: Json) -> Iterator[Row]:
    kd = f["keyed_drain"]
    for vendor, name in VENDORS.items():
        if vendor not in kd:
            continue
        d = kd[vendor]
        keys = [k for k in d["rates"] if k != "0"]
        yield (
            f"keyed drain on {name}, {n(kd['messages'])} messages over {slash(int(k) for k in keys)} keys,"
            f" {kd['processes']} processes",
            f"{slash(median(d['rates'][k]) for k in keys)} msg/s",
            f"the unkeyed drain of the same run: {n(median(d['rates']['0']))} msg/s",
            slash((median(d["ratios"][k]) for k in keys), x),
        )
        if len(d["claim_cost_s"]) >= 2:
            (small, cost_small), (large, cost_large) = list(d["claim_cost_s"].items())[:2]
            yield (
                f"a claim of 100 on {name}, {n(int(small))} then {n(int(large))} pending on 5 keys",
                f"{cost_small * 1000:.1f} then {cost_large * 1000:.1f} ms",
                "",
                f"{x(cost_large / cost_small)} for ten times the backlog",
            )


def memory(f: Json) -> Iterator[Row]:
    m = f["memory"]
    yield (
        f"worker memory (RSS) over {n(m['messages'])} messages",
        f"{m['rss_final_kib'] / 1024:.1f} MiB at the end",
        f"{m['rss_after_warmup_kib'] / 1024:.1f} MiB a fifth of the way in",
        f"{m['growth_percent']:+.1f}%",
    )


def compare(f: Json) -> Iterator[Row]:
    c = f["compare"]
    peers = {name: by for name, by in c.items() if isinstance(by, dict)}
    if not peers:
        return
    ratios = [p["ratio_to_minimal"] for by in peers.values() for p in by.values() if p["ratio_to_minimal"]]
    drain = f.get("drain", {}).get("by_processes", {})
    yield (
        f"peers, drain with {slash(next(iter(peers.values())), str)} processes, {n(c['messages'])} jobs (jobs/s)",
        "; ".join(f"{name} {each(by, 'per_s')}" for name, by in peers.items()),
        "the hand-written relay of the drain row",
        f"{min(ratios):.3f}x to {max(ratios):.3f}x (the outbox: {each(drain, 'ratio', x)})"
        if ratios and drain
        else "the drain section did not run",
    )


def mariadb_drain(f: Json) -> Iterator[Row]:
    d = f["mariadb"]["drain"]
    by = d["by_processes"]
    yield (
        f"MariaDB drain, {slash(by, str)} worker processes, {n(d['messages'])} messages",
        f"{each(by, 'outbox_per_s')} msg/s",
        f"the two-statement relay on a twin table: {each(by, 'reference_per_s')} msg/s",
        f"**{each(by, 'ratio', x)}**",
    )


def brokers(f: Json) -> Iterator[Row]:
    b = f["brokers"]
    rate = {r["destination"]: r["median_rate"] for r in b["results"]}
    names = [d for d in BROKERS if d in rate]
    yield (
        f"to {' / '.join(BROKERS[d] for d in names)}, one thread, {n(b['messages'])} messages",
        f"{slash(rate[d] for d in names)} msg/s",
        f"a no-op handler, {n(rate['noop'])} msg/s",
        slash((rate[d] / rate["noop"] for d in names), x),
    )
    if "kafka" in rate and "kafka-ref" in rate:
        yield (
            "the Kafka transport",
            f"{n(rate['kafka'])} msg/s",
            f"a hand-written confluent-kafka loop: {n(rate['kafka-ref'])} msg/s",
            f"**{x(rate['kafka'] / rate['kafka-ref'])}**",
        )


def topology(f: Json) -> Iterator[Row]:
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


def migrations(f: Json) -> Iterator[Row]:
    for vendor, name in VENDORS.items():
        for rows, variants in f["migrations"].get(vendor, {}).items():
            runs = variants["package"]
            longest = {step: median([r["steps"][step]["longest_send_s"] for r in runs]) for step in runs[0]["steps"]}
            floor = median([step["floor_s"] for r in runs for step in r["steps"].values()])
            yield (
                f"the longest `send()` while this release's migrations run on {name}, {n(int(rows))} rows,"
                " workers draining",
                "; ".join(f"`{step}` {n(s * 1000)} ms" for step, s in longest.items()),
                f"the longest `send()` with no migration running: {floor * 1000:.0f} ms",
                "",
            )


def autovacuum(f: Json) -> Iterator[Row]:
    a = f["autovacuum"]
    tuned = next(r for r in a["results"] if r["tuned"])
    default = next(r for r in a["results"] if not r["tuned"])
    yield (
        f"dead row versions under a steady producer, {n(a['args']['history'])} rows of history",
        f"the migration's settings: median {n(tuned['dead_median'])}",
        f"PostgreSQL's defaults: {n(default['dead_median'])}",
        f"the claim's walk in pages: {tuned['walk_pages_median']:.0f} against {default['walk_pages_median']:.0f}",
    )


def tasks(f: Json) -> Iterator[Row]:
    t = f["tasks"]
    runs = {c: t[f"x{c}"] for c in sorted((k[1:] for k in t if k.startswith("x")), key=int)}
    yield (
        f"Django tasks (`django_outbox.tasks.OutboxBackend`), {slash(runs, str)} worker processes",
        f"{slash(r['per_s']['outbox-tasks'] for r in runs.values())} tasks/s",
        f"django-tasks-db's `db_worker`: {slash(r['per_s']['django-tasks-db'] for r in runs.values())} tasks/s",
        each(runs, "ratio_outbox_to_peer", lambda v: f"{v:.1f}x"),
    )


def chaos(f: Json) -> Iterator[Row]:
    c = f["chaos"]
    exact = c["effects applied more than once"] == 0 and c["effects lost"] == 0
    yield (
        "the chaos run: killed workers and consumers, a database restart, a broker outage",
        f"{n(c['sent (committed)'])} committed: {c['lost']} lost, {c['duplicates unexplained']} unexplained"
        f" duplicates, {c['keys delivered out of order']} keys out of order",
        "its audit",
        "every effect applied exactly once" if exact else "effects applied twice or lost: see the JSON",
    )


#: (section, its rows), in the order of the docs' table.
ROWS: tuple[tuple[str, Rows], ...] = (
    cells("send", "send")(
        "`send()` in a one-row business transaction",
        "{send_us_per_tx:,.0f} µs",
        "the floor: the same transaction plus one `INSERT` into a minimal table, {minimal_us_per_tx:,.0f} µs",
        "**{ratio_to_floor:.2f}x** (NOTIFY off {ratio_to_floor_no_notify:.2f}x)",
    ),
    cells("send", "send_batch")(
        "100 messages in one transaction (`{api}()`) against one",
        "{send_100_us:,.0f} against {send_1_us:,.0f} µs",
        "the floor: one `INSERT` of 100 rows against one, {floor_100_us:,.0f} against {floor_1_us:,.0f} µs",
        "{ratio:.2f}x (the floor: {floor_ratio:.2f}x)",
    ),
    ("send_many", send_many),
    ("drain", drain),
    cells("latency", "latency_neighbour")(
        "commit to handler, idle worker, PostgreSQL `NOTIFY`",
        "p50 {idle[unkeyed][p50_ms]:.1f} / p99 {idle[unkeyed][p99_ms]:.1f} ms",
        "the hand-written relay woken by its own `NOTIFY`: p50 {idle[minimal][p50_ms]:.1f}"
        " / p99 {idle[minimal][p99_ms]:.1f} ms",
        "p50 {idle[unkeyed_p50_to_minimal]:.2f}x",
    ),
    cells("latency", "latency_neighbour")(
        "the same, keyed, a busy neighbour database on the server",
        "p50 {busy[keyed][p50_ms]:.1f} / p99 {busy[keyed][p99_ms]:.1f} ms",
        "unkeyed, same phase: p50 {busy[unkeyed][p50_ms]:.1f} / p99 {busy[unkeyed][p99_ms]:.1f} ms",
        "{busy[keyed_p50_ratio]:.2f}x / {busy[keyed_p99_ratio]:.2f}x",
    ),
    ("enqueue", enqueue),
    ("keyed", keyed),
    ("keyed_drain", keyed_drain),
    cells("scale", "claim_cost")(
        "claim of 100, {small[history_rows]:,.0f} then {large[history_rows]:,.0f} rows of history",
        "{small[claim_ms]:.2f} then {large[claim_ms]:.2f} ms ({raw_ratio:.2f}x)",
        "100 rows by primary key from the same table: {small[reference_ms]:.2f} then {large[reference_ms]:.2f} ms"
        " ({reference_ratio:.2f}x)",
        "{ratio:.2f}x, in units of the reference",
    ),
    cells("opentx", "open_transaction")(
        "drain while a transaction stays open elsewhere for {window_s:.0f} s",
        "{held_per_s:,.0f} msg/s",
        "the same drain without it: {free_per_s:,.0f} msg/s",
        "{ratio:.2f}x",
    ),
    ("memory", memory),
    ("compare", compare),
    ("mariadb", mariadb_drain),
    cells("mariadb", "mariadb")(
        "MariaDB `send()` in a one-row business transaction",
        "{send[send_us_per_tx]:,.0f} µs",
        "the floor, {send[floor_us_per_tx]:,.0f} µs",
        "**{send[send_vs_floor]:.2f}x** (keyed {send[send_keyed_vs_floor_keyed]:.2f}x)",
    ),
    ("send_many", send_many_mariadb),
    ("brokers", brokers),
    ("topology", topology),
    ("migrations", migrations),
    ("autovacuum", autovacuum),
    ("tasks", tasks),
    ("chaos", chaos),
)


def render(results: Json) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    for section, rows in ROWS:
        try:
            made = list(rows(results["figures"]))
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
