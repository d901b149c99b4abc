"""``send()`` and ``send_many()`` of two whole source trees, each in a process of its own, interleaved.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_send_ab python bench/send_ab.py BASE_TREE
        [--transactions 400] [--reps 5] [--chunk 10] [--kinds plain,floor,one,quiet,many] [--output FILE]

``bench/producer_ab.py`` swaps only ``store/producing.py`` and keeps this tree's validation in both
variants; this one runs everything of each tree, ``api.py`` included, so a change to ``send()``'s own
Python is measured too. Each tree runs in a child process (``PYTHONPATH`` = the tree) on the same database
and table; the parent hands out chunks of ``--chunk`` transactions of one kind to one child at a time, the
order of (tree, kind) reversed every other round, so both trees see the same load of a shared machine.
Each transaction creates one ``Order`` and then, by kind: nothing (``plain``), one hand-written ``INSERT``
into the minimal table (``floor``, the target's reference), one ``send()`` (``one``), one ``send()`` with
``OUTBOX["NOTIFY"] = False`` (``quiet``), or ``send_many()`` of 100 (``many``); ``call`` times only the
``send()`` call inside its transaction, which leaves the commit's noise out, ``floor_call`` the floor's
``INSERT`` likewise. The figures are medians of
the repetitions' median times, and the ratios (``one`` to ``floor``, ``many`` to ``one``) medians of the
repetitions' ratios, each tree against its own references of the same repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("plain", "floor", "one", "quiet", "many", "call", "floor_call")


def child() -> None:
    """The child's loop: ``<kind> <n>`` on stdin, the n transaction times (seconds, JSON) on stdout."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection, transaction
    from django.test import override_settings

    from bench.minimal_relay import INSERT_ONE
    from django_outbox import outbox
    from testproject.shop.models import Order

    quiet = override_settings(OUTBOX={**settings.OUTBOX, "NOTIFY": False})

    def one(kind: str, i: int) -> float:
        started = time.perf_counter()
        with transaction.atomic():
            order = Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3)
            payload = {"order_id": order.pk, "item": order.item, "quantity": order.quantity}
            if kind in ("one", "quiet"):
                outbox.send("bench.noop", payload)
            elif kind == "floor":
                with connection.cursor() as cursor:
                    cursor.execute(INSERT_ONE, [json.dumps(payload)])
            elif kind == "many":
                outbox.send_many([{"topic": "bench.noop", "payload": {**payload, "n": n}} for n in range(100)])
            elif kind == "call":  # the send() call alone, inside the transaction: no commit in the figure
                started = time.perf_counter()
                outbox.send("bench.noop", payload)
                return time.perf_counter() - started
            elif kind == "floor_call":  # the floor's INSERT alone, likewise
                started = time.perf_counter()
                with connection.cursor() as cursor:
                    cursor.execute(INSERT_ONE, [json.dumps(payload)])
                return time.perf_counter() - started
        return time.perf_counter() - started

    for kind in KINDS:  # warm-up: connection, caches, plans
        for i in range(3):
            one(kind, i)
    print("ready", flush=True)
    for line in sys.stdin:
        kind, count = line.split()
        if kind == "quiet":
            with quiet:
                times = [one(kind, i) for i in range(int(count))]
        else:
            times = [one(kind, i) for i in range(int(count))]
        print(json.dumps(times), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="the other source tree")
    parser.add_argument("--transactions", type=int, default=400, help="of each kind and tree per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=10, help="transactions handed to one child at a time")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"a comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--output", type=Path, help="write the repetitions and medians here as JSON")
    args = parser.parse_args()
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_send_ab")
    sys.path.insert(0, str(ROOT))
    from bench import tables
    from bench.minimal_relay import CREATE

    tables.ensure_database(os.environ["DATABASE_URL"])
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    with tables.connect(os.environ["DATABASE_URL"]) as conn:
        for statement in CREATE:
            conn.execute(statement)
    trees = {"base": args.base.resolve(), "new": ROOT}
    children: dict[str, subprocess.Popen[str]] = {}
    for name, tree in trees.items():
        children[name] = subprocess.Popen(
            # this script, from this tree, but the tree's own packages (PYTHONPATH): django_outbox, bench, testproject
            [sys.executable, str(Path(__file__).resolve()), "--child"],
            cwd=tree,
            env={**env, "PYTHONPATH": str(tree)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for proc in children.values():
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("a child did not start")
    kinds = [kind for kind in KINDS if kind in args.kinds.split(",")]
    plan = [(name, kind) for name in trees for kind in kinds]
    reps: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            with tables.connect(os.environ["DATABASE_URL"]) as conn:
                tables.truncate(conn)
                conn.execute("TRUNCATE bench_minimal_message")
            times: dict[tuple[str, str], list[float]] = {key: [] for key in plan}
            for _ in range(max(1, args.transactions // args.chunk)):
                # A fresh random order each round: the chunk that follows a switch of process pays for
                # the caches the other process took, so no (tree, kind) may always come first.
                order = random.sample(plan, len(plan))
                for name, kind in order:
                    count = args.chunk if kind != "many" else max(1, args.chunk // 5)
                    proc = children[name]
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{kind} {count}\n")
                    proc.stdin.flush()
                    times[(name, kind)] += json.loads(proc.stdout.readline())
            result: dict[str, Any] = {}
            for name in trees:
                us = {kind: statistics.median(times[(name, kind)]) * 1e6 for kind in kinds}
                result[name] = {f"{kind}_us": value for kind, value in us.items()}
                if "one" in us and "floor" in us:
                    result[name]["one_vs_floor"] = us["one"] / us["floor"]
                if "quiet" in us and "floor" in us:
                    result[name]["quiet_vs_floor"] = us["quiet"] / us["floor"]
                if "call" in us and "floor_call" in us:
                    result[name]["call_vs_floor_call"] = us["call"] / us["floor_call"]
                if "many" in us and "one" in us:
                    result[name]["many_vs_one"] = us["many"] / us["one"]
            reps.append(result)
            print(f"rep {rep}: " + json.dumps({n: {k: round(v, 3) for k, v in r.items()} for n, r in result.items()}))
    finally:
        for proc in children.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()
    medians = {name: {key: statistics.median(r[name][key] for r in reps) for key in reps[0][name]} for name in trees}
    for name in trees:
        for kind in ("one", "call", "many"):
            if f"{kind}_us" in medians["base"]:
                paired = [r[name][f"{kind}_us"] / r["base"][f"{kind}_us"] for r in reps]
                medians[name][f"paired_{kind}_vs_base"] = statistics.median(paired)
    print("medians:")
    for name, values in medians.items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f}" if "_vs_" in k else f"{k} {v:.0f}" for k, v in values.items()))
    if args.output:
        options = {k: str(v) for k, v in vars(args).items()}
        args.output.write_text(json.dumps({"args": options, "reps": reps, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        sys.path.pop(0)  # this script's directory: bench's modules come from the tree under test
        child()
    else:
        sys.exit(main())
