"""The outbox's benchmark: every figure beside its reference, measured in the same run, as a ratio.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_outbox python bench/run.py [--quick | --smoke]
        [--only send,drain,latency,scale,opentx,memory,compare] [--compare-python PATH] [--output FILE]

It creates the database named in DATABASE_URL (and ``<name>_compare`` for the other libraries) if
needed, migrates it and empties the outbox tables as it goes: point it at a database of its own. It
prints a table and writes ``bench/results/<timestamp>.json``. ``--quick`` finishes in a few minutes,
``--smoke`` in seconds (for CI: it checks that the harness still works, its figures mean nothing).
See docs/performance.md for what each figure is and the results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

SECTIONS = ("send", "drain", "latency", "scale", "opentx", "memory", "compare")
DEFAULT_COMPARE_PYTHON = ROOT / "bench" / ".venv-compare" / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller sizes: a few minutes")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition: seconds (CI)")
    parser.add_argument("--only", help=f"comma-separated sections among {','.join(SECTIONS)}")
    parser.add_argument(
        "--compare-python",
        help="interpreter of the environment holding procrastinate and django-tasks-db "
        f"(default {DEFAULT_COMPARE_PYTHON.relative_to(ROOT)} if it exists; see bench/compare_setup.sh)",
    )
    parser.add_argument("--output", type=Path, help="JSON file to write (default bench/results/<timestamp>.json)")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    unknown = only - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose among {', '.join(SECTIONS)}")

    from bench import figures, tables

    dsn = os.environ["DATABASE_URL"]
    if not dsn.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database of the benchmark's own")
    tables.ensure_database(dsn)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0)
    call_command("migrate", database="sqlite", verbosity=0)

    compare_python = args.compare_python
    if compare_python is None and DEFAULT_COMPARE_PYTHON.exists():
        compare_python = str(DEFAULT_COMPARE_PYTHON)
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    ctx = figures.Context(
        dsn=dsn, sizes=figures.SIZES[size_name], compare_python=compare_python, log=lambda s: print(s, flush=True)
    )
    results: dict[str, Any] = {"mode": size_name, "environment": figures.environment(dsn), "figures": {}}
    out = results["figures"]
    started = time.monotonic()
    steps: list[tuple[str, str, Any]] = [
        ("send", "a. send() overhead", lambda: figures.send_overhead(ctx)),
        ("drain", "b. drain throughput", lambda: figures.drain(ctx)),
        ("latency", "c. latency (PostgreSQL)", lambda: figures.latency(ctx, database="default")),
        ("latency", "c. latency (SQLite)", lambda: figures.latency(ctx, database="sqlite")),
        ("scale", "d. claim cost vs history", lambda: figures.claim_cost(ctx)),
        ("opentx", "d. open transaction", lambda: figures.open_transaction(ctx, expected_rate=_rate(out))),
        ("memory", "e. memory", lambda: figures.memory(ctx)),
        ("compare", "comparisons", lambda: figures.compare(ctx, out.get("drain", {}))),
    ]
    keys = {
        "a. send() overhead": "send",
        "b. drain throughput": "drain",
        "c. latency (PostgreSQL)": "latency_postgresql",
        "c. latency (SQLite)": "latency_sqlite",
        "d. claim cost vs history": "claim_cost",
        "d. open transaction": "open_transaction",
        "e. memory": "memory",
        "comparisons": "compare",
    }
    for section, title, measure in steps:
        if section not in only:
            continue
        print(f"{title} ...", flush=True)
        t = time.monotonic()
        out[keys[title]] = measure()
        print(f"  ({time.monotonic() - t:.0f}s)", flush=True)
    results["seconds"] = time.monotonic() - started
    results["notes"] = ctx.notes
    output = args.output or ROOT / "bench" / "results" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{size_name}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2, default=str))
    print()
    print(render(results))
    print(f"\nwrote {output}")
    return 0


def _rate(out: dict[str, Any]) -> float:
    one = out.get("drain", {}).get("by_processes", {}).get("1")
    return float(one["outbox_per_s"]) if one else 5000.0


def render(results: dict[str, Any]) -> str:
    """The results as a Markdown table: figure, measured, reference, ratio, target."""
    f = results["figures"]
    rows: list[tuple[str, str, str, str, str]] = []
    if "send" in f:
        s = f["send"]
        rows.append(
            (
                "a. send() in a transaction",
                f"{s['send_us_per_tx']:.0f} µs/tx",
                f"{s['plain_us_per_tx']:.0f} µs/tx without",
                f"{s['ratio']:.2f}x",
                f"<= 1.3x {_ok(s)}",
            )
        )
        rows.append(
            (
                "a. same, OUTBOX NOTIFY off",
                f"{s['send_no_notify_us_per_tx']:.0f} µs/tx",
                "",
                f"{s['ratio_no_notify']:.2f}x",
                "",
            )
        )
        for label, key in (
            ("same row by hand-written SQL", "hand_written"),
            ("a second ORM business row", "second_row"),
        ):
            rows.append(
                (f"a. floor: {label}", f"{s[key + '_us_per_tx']:.0f} µs/tx", "", f"{s['ratio_' + key]:.2f}x", "")
            )
        rows.append(
            (
                "a. send()'s added cost",
                "",
                "the hand-written SQL's",
                f"{s['added_cost_vs_hand_written']:.2f}x",
                "",
            )
        )
    if "drain" in f:
        for processes, d in f["drain"]["by_processes"].items():
            rows.append(
                (
                    f"b. drain, {processes} process(es)",
                    f"{d['outbox_per_s']:,.0f} msg/s",
                    f"{d['baseline_per_s']:,.0f} msg/s hand-written",
                    f"{d['ratio']:.2f}x",
                    f">= 0.5x {_ok(d)}",
                )
            )
            if "ratio_one_thread" in d:
                rows.append(
                    (
                        f"b. same, {processes} process, --concurrency 1",
                        f"{d['one_thread_per_s']:,.0f} msg/s",
                        "the same hand-written runs",
                        f"{d['ratio_one_thread']:.2f}x",
                        "",
                    )
                )
    for key, name in (("latency_postgresql", "PostgreSQL, NOTIFY"), ("latency_sqlite", "SQLite, polling")):
        if key in f:
            lat = f[key]
            extra = f" (poll {lat['poll_interval_s']:.1f}s)" if "poll_interval_s" in lat else ""
            rows.append(
                (
                    f"c. commit to handler, {name}{extra}",
                    f"p50 {lat['p50_ms']:.1f} / p95 {lat['p95_ms']:.1f} / p99 {lat['p99_ms']:.1f} ms",
                    "",
                    "",
                    f"p50 <= 5, p99 <= 20 {_ok(lat)}" if "ok" in lat else "",
                )
            )
    if "claim_cost" in f:
        c = f["claim_cost"]
        rows.append(
            (
                f"d. claim 100, {c['large']['history_rows']:,} rows of history",
                f"{c['large']['claim_ms']:.2f} ms",
                f"{c['small']['claim_ms']:.2f} ms with {c['small']['history_rows']:,}",
                f"{c['ratio']:.2f}x",
                f"<= 1.25x {_ok(c)}",
            )
        )
        rows.append(
            (
                "d. record 100 outcomes, same",
                f"{c['large']['record_ms']:.2f} ms",
                f"{c['small']['record_ms']:.2f} ms",
                f"{c['record_ratio']:.2f}x",
                "",
            )
        )
        large = c["large"]
        if "claim_unprepared" in large and "record_unprepared" in large:
            prepared = large["claim_prepared"] + large["record_prepared"]
            unprepared = large["claim_unprepared"] + large["record_unprepared"]
            rows.append(
                (
                    "d. same, claim + record prepared",
                    f"{prepared:.2f} ms",
                    f"{unprepared:.2f} ms unprepared",
                    f"{prepared / unprepared:.2f}x",
                    "",
                )
            )
    if "open_transaction" in f:
        o = f["open_transaction"]
        rows.append(
            (
                f"d. drain with a {o['window_s']:.0f}s open transaction",
                f"{o['held_per_s']:,.0f} msg/s",
                f"{o['free_per_s']:,.0f} msg/s without",
                f"{o['ratio']:.2f}x",
                f"drop {o['drop_percent']:.0f}%",
            )
        )
    if "memory" in f:
        m = f["memory"]
        rows.append(
            (
                f"e. worker RSS, {m['messages']:,} messages",
                f"{m['rss_final_kib'] / 1024:.1f} MiB at the end",
                f"{m['rss_after_warmup_kib'] / 1024:.1f} MiB after warm-up",
                f"{m['growth_percent']:+.1f}%",
                "no growth",
            )
        )
        rows.append(
            (
                "e. same run, drain rate",
                f"{m['rate_last_quarter_per_s']:,.0f} msg/s in the last quarter",
                f"{m['rate_first_quarter_per_s']:,.0f} msg/s in the first",
                _ratio(m["rate_last_quarter_per_s"], m["rate_first_quarter_per_s"]),
                "",
            )
        )
    for name, by in f.get("compare", {}).items():
        if not isinstance(by, dict):
            continue
        for processes, c in by.items():
            ratio = c["ratio_to_baseline"]
            rows.append(
                (
                    f"{name}, {processes} process(es)",
                    f"{c['per_s']:,.0f} jobs/s",
                    "hand-written relay (b.)",
                    f"{ratio:.2f}x" if ratio else "",
                    "",
                )
            )
    header = ("figure", "measured", "reference (same run)", "ratio", "target")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ratio(value: float, reference: float) -> str:
    """``value / reference`` as ``1.23x``, or blank when a tiny run had too few samples for either."""
    if not (reference > 0 and value == value):  # NaN != NaN
        return ""
    return f"{value / reference:.2f}x"


def _ok(figure: dict[str, Any]) -> str:
    return "(met)" if figure.get("ok") else "(missed)"


if __name__ == "__main__":
    sys.exit(main())
