"""The MariaDB drain of several variants of the worker, interleaved, each beside the same-run reference.

    python bench/mariadb_ab.py [--variant NAME=MIGRATION[:WORKER OPTIONS]] ... [--messages 10000]
        [--processes 1] [--reps 3]

    python bench/mariadb_ab.py --variant initial=0001_initial --variant now=latest
    python bench/mariadb_ab.py --variant one=latest:--concurrency=1 --variant two=latest:--concurrency=2

A variant is a state of the ``django_outbox`` migrations (``latest``: all of them) and the options its
``outbox_worker`` processes get. Each repetition drains the same backlog once per variant, in an order
rotated by one, and once with the hand-written two-statement relay on its twin table
(``bench/mariadb_relay.py``), so each variant's ratio is to a reference of its own repetition: the machine
is shared and its load moves between runs (docs/performance.md, "## MariaDB"). The database is
``MARIADB_URL`` (``bench/mariadb.py``'s default otherwise); it ends at the latest migration.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import mariadb  # noqa: E402
from bench.figures import median  # noqa: E402


@dataclass(frozen=True)
class Variant:
    name: str
    migration: str
    options: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    name, _, rest = text.partition("=")
    migration, _, options = rest.partition(":")
    return Variant(name, migration or "latest", tuple(options.split()))


def migrate(dsn: str, migration: str) -> None:
    target = [] if migration == "latest" else ["django_outbox", migration]
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", *target, "--verbosity", "0"],
        cwd=ROOT,
        env={**os.environ, **mariadb._django_env(dsn)},
        check=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    dsn = mariadb.url()
    print(f"{mariadb.prepare(dsn)}, database {dsn.rsplit('/', 1)[-1]!r}", flush=True)
    runs: list[Variant | None] = [*args.variant, None]  # None: the reference
    rounds: list[dict[str, float]] = []
    current = "latest"
    try:
        for rep in range(args.reps):
            order = runs[rep % len(runs) :] + runs[: rep % len(runs)]
            rates: dict[str, float] = {}
            for variant in order:
                if variant is None:
                    rates["reference"] = mariadb.drain_once(dsn, mariadb.REFERENCE, args.processes, args.messages)
                    continue
                if variant.migration != current:
                    migrate(dsn, variant.migration)
                    current = variant.migration
                system = mariadb.System(variant.name, mariadb.OUTBOX.table, "relaying", variant.options)
                rates[variant.name] = mariadb.drain_once(dsn, system, args.processes, args.messages)
            rounds.append(rates)
            print(f"  rep {rep + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()), flush=True)
    finally:
        if current != "latest":
            migrate(dsn, "latest")
    print(f"{args.processes} process(es), N={args.messages:,}, medians of {args.reps}:")
    for variant in args.variant:
        rate = median([r[variant.name] for r in rounds])
        ratio = median([r[variant.name] / r["reference"] for r in rounds])
        print(f"  {variant.name}: {rate:,.0f} msg/s, {ratio:.2f}x the same-run reference")
    print(f"  reference: {median([r['reference'] for r in rounds]):,.0f} msg/s")


if __name__ == "__main__":
    main()
