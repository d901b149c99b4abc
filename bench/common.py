"""What the benchmark's scripts share: medians, interleaving, a business transaction, tables, JSON, Django."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
Json = dict[str, Any]
T = TypeVar("T")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] if ordered else float("nan")


def ratio(reps: Sequence[Json], mode: str, reference: str) -> float:
    """The median over the repetitions of ``mode / reference`` within each."""
    return median([r[mode] / r[reference] for r in reps])


def medians(reps: Sequence[Json], keys: Sequence[str], suffix: str = "") -> Json:
    return {f"{k}{suffix}": median([r[k] for r in reps]) for k in keys}


def interleaved(reps: int) -> list[bool]:
    """For each repetition, whether the measured thing goes first (alternating)."""
    return [rep % 2 == 0 for rep in range(reps)]


def rotated(items: Sequence[T], rep: int) -> list[T]:
    """``items`` rotated by ``rep``: over the repetitions each sees every position."""
    k = rep % len(items)
    return [*items[k:], *items[:k]]


def per_transaction(modes: Sequence[str], n: int, one: Callable[[str, int], float]) -> dict[str, float]:
    """Median µs of ``one(mode, i)`` per mode, the modes interleaved one transaction at a time (the order
    reversed every other one), so that each sees the same load of a shared machine."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(n):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            times[mode].append(one(mode, i))
    return {mode: median(values) * 1e6 for mode, values in times.items()}


def business_transaction(i: int, write: Callable[[Any], None]) -> float:
    """Seconds of one business transaction (one ``shop.Order``) with ``write(order)`` inside it."""
    from django.db import transaction

    from testproject.shop.models import Order

    started = time.perf_counter()
    with transaction.atomic():
        write(Order.objects.create(customer_email="buyer@example.com", item="book", quantity=1 + i % 3))
    return time.perf_counter() - started


def order_payload(order: Any) -> Json:
    return {"order_id": order.pk, "item": order.item, "quantity": order.quantity}


def execute(statement: str, params: Any = None) -> None:
    """One statement on Django's default connection, its result left unread (for timed statements)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """One statement on Django's default connection; its rows, if any."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def parser(doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def django_env(dsn: str, settings: str = "bench.settings", **extra: str) -> dict[str, str]:
    return {"DJANGO_SETTINGS_MODULE": settings, "DATABASE_URL": dsn, **extra}


def manage(dsn: str, *args: str, quiet: bool = False, **extra: str) -> float:
    """``manage.py *args`` on ``dsn`` in a process of its own (Django reads its settings once); its seconds."""
    command = [sys.executable, str(ROOT / "manage.py"), *args]
    env = {**os.environ, **django_env(dsn, **extra)}
    started = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=quiet)
    return time.monotonic() - started


def setup_django(*aliases: str, settings: str = "bench.settings") -> None:
    """Create the database of ``DATABASE_URL`` if needed, set Django up and migrate ``aliases``."""
    import django
    from django.core.management import call_command

    from bench import tables

    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    if os.environ.get("DATABASE_URL"):
        tables.ensure_database(os.environ["DATABASE_URL"])
    django.setup()
    for alias in aliases:
        call_command("migrate", database=alias, verbosity=0)


def child_json(args: Sequence[str], *, flag: str = "--output", env: dict[str, str] | None = None) -> Any:
    """The JSON that ``args``, run by this interpreter with ``flag FILE``, wrote there (it failing raises)."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "child.json"
        command = [sys.executable, *args, flag, str(output)]
        subprocess.run(command, cwd=ROOT, env={**os.environ, **(env or {})}, check=True)
        return json.loads(output.read_text())


def by_database(args: argparse.Namespace, name: str, measure: Callable[[str], Json], **top: Any) -> None:
    """``measure(vendor)`` in the database ``name`` (``BENCH_DATABASE`` when set: the harness names it after its
    own, so two runs never share one) on each server of ``--databases`` (``mysql``: ``mariadb.url()``'s;
    ``postgresql``: the harness's, ``BENCH_POSTGRESQL``), each in a process of its own (Django reads its
    settings once); into ``--json``: ``{vendor: figures, **top}``."""
    vendors = args.databases.split(",")
    if len(vendors) > 1:
        script = str(Path(sys.argv[0]).resolve())
        options = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("databases", "json")]
        combined: Json = {}
        for vendor in vendors:
            combined.update(child_json([script, f"--databases={vendor}", *options], flag="--json"))
    else:
        from bench import mariadb  # it imports this module

        postgresql = os.environ.get("BENCH_POSTGRESQL") or "postgres://postgres@127.0.0.1:5432"
        server = postgresql if vendors[0] == "postgresql" else mariadb.url()
        database = os.environ.get("BENCH_DATABASE") or name
        os.environ["DATABASE_URL"] = urlparse(server)._replace(path=f"/{database}").geturl()
        os.environ["BENCH_LOG_LEVEL"] = "WARNING"
        combined = {vendors[0]: measure(vendors[0]), **top}
    if args.json:
        write_json(args.json, combined)
