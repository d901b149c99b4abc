"""``send()`` without opentelemetry installed costs nothing more than ``send()`` without the tracing hook.

    python bench/observability.py [--sends 2000] [--rounds 3]   (SQLite in a temporary file, or DATABASE_URL)

Each variant runs ``--sends`` calls of ``outbox.send()`` in one rolled-back transaction, in a process of its
own, ``--rounds`` times interleaved; the fastest rounds are compared (on a shared machine the median and
the tail measure the neighbours too): ``reference`` (``django_outbox.api`` loaded without the hook's two
lines), ``without`` (opentelemetry unimportable; the process checks none was imported), ``no-span``
(opentelemetry-api, no span) and ``in-span`` (the SDK, a span active). Fails (exit 1) when ``without`` is
more than ``--tolerance`` (3%) slower than ``reference``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402

#: The two lines of ``send()`` that the reference leaves out, at whatever indentation they stand.
HOOK = re.compile(r"^ *if trace_headers is not None:.*\n *headers = trace_headers\(headers\)\n", re.MULTILINE)
VARIANTS = ("reference", "without", "no-span", "in-span")


def child(variant: str, sends: int) -> None:
    if variant == "without":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import opentelemetry now fails
    if variant == "reference":
        spec = importlib.util.find_spec("django_outbox")
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["django_outbox"] = package
        path = ROOT / "django_outbox" / "api.py"
        source = path.read_text(encoding="utf-8")
        assert HOOK.search(source), "the hook's lines changed: update bench/observability.py"
        api = types.ModuleType("django_outbox.api")
        api.__file__, api.__package__ = str(path), "django_outbox"
        sys.modules["django_outbox.api"] = api
        exec(compile(HOOK.sub("", source), str(path), "exec"), api.__dict__)
        spec.loader.exec_module(package)
    import django

    django.setup()
    from django.db import transaction

    from django_outbox import outbox

    span = None
    if variant == "in-span":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        span = trace.get_tracer("bench").start_span("view")
    payload = {"order": 1, "total": "9.99", "lines": [1, 2, 3]}

    def run() -> float:
        with transaction.atomic():
            started = time.perf_counter()
            for _ in range(sends):
                outbox.send("probe.bench", payload)
            elapsed = time.perf_counter() - started
            transaction.set_rollback(True)
        return elapsed

    if span is not None:
        from opentelemetry import trace

        with trace.use_span(span):
            run()  # warm up
            elapsed = run()
    else:
        run()
        elapsed = run()
    leaked = sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None)
    print(json.dumps({"variant": variant, "per_send_us": elapsed / sends * 1e6, "otel_modules": len(leaked)}))


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--child")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.sends)
        return 0
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DEBUG": "false", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"], env["SQLITE_PATH"] = "", str(Path(tmp) / "bench.sqlite3")
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env, check=True, cwd=ROOT)
        results: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", variant, "--sends", str(args.sends)],
                    env=env,
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                row = json.loads(out.strip().splitlines()[-1])
                if variant == "without" and row["otel_modules"]:
                    print("opentelemetry was imported although it is not installed", file=sys.stderr)
                    return 1
                results[variant].append(row["per_send_us"])
    medians = {v: common.median(r) for v, r in results.items()}
    fastest = {v: min(r) for v, r in results.items()}
    for variant in VARIANTS:
        runs = " ".join(f"{r:.1f}" for r in results[variant])
        ratio = fastest[variant] / fastest["reference"]
        print(
            f"{variant:<10} fastest {fastest[variant]:7.1f} us/send  x{ratio:.3f} of reference"
            f"  (median {medians[variant]:.1f}; rounds {runs})"
        )
    ratio = fastest["without"] / fastest["reference"]
    if args.json:
        common.write_json(args.json, {"per_send_us": medians, "fastest_us": fastest, "without_vs_reference": ratio})
    if ratio > 1 + args.tolerance:
        print(f"send() without opentelemetry is {ratio:.3f}x the reference, over 1+{args.tolerance}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
