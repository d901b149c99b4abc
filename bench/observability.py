"""What observability costs ``send()``, and a real worker's metrics (docs/operating.md).

**send()**: each variant runs ``--sends`` calls of ``outbox.send()`` in one rolled-back transaction (SQLite
in a temporary file, or DATABASE_URL), in a process of its own, ``--rounds`` times interleaved; the fastest
rounds are compared (on a shared machine the median and the tail measure the neighbours too):
``reference`` (``django_outbox.api`` loaded without the hook's two lines), ``without`` (opentelemetry
unimportable; the process checks none was imported), ``no-span`` (opentelemetry-api, no span) and
``in-span`` (the SDK, a span active). **--metrics-run** (DATABASE_URL: PostgreSQL): ``outbox_worker
--metrics-port 0`` on the test settings' probe handlers, bursts of messages (some fail at random and are
retried, some for good), the worker scraped every half second into bench/results/metrics-run.json, drawn
into docs/img/metrics-run.png.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402

#: The two lines of ``send()`` that the reference leaves out, at whatever indentation they stand.
HOOK = re.compile(r"^ *if trace_headers is not None:.*\n *headers = trace_headers\(headers\)\n", re.MULTILINE)
VARIANTS = ("reference", "without", "no-span", "in-span")
#: The picture's panels (their y axes), then each line: its panel, legend and series (a counter: its rate).
PANELS = ("rate (from the _total counters)", "messages (sampled every 5 s)", "seconds / threads")
LINES = (
    (0, "delivered / s", "outbox_messages_delivered_total"),
    (0, "failed attempts / s", "outbox_messages_failed_total"),
    (0, "dead / s", "outbox_messages_dead_total"),
    (1, "backlog: pending", "outbox_backlog_messages{status=pending}"),
    (1, "backlog: dead", "outbox_backlog_messages{status=dead}"),
    (2, "outbox_lag_seconds", "outbox_lag_seconds"),
    (2, "outbox_worker_threads_busy", "outbox_worker_threads_busy"),
)


def child(variant: str, sends: int, output: Path) -> None:
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

    span: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if variant == "in-span":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        span = trace.use_span(trace.get_tracer("bench").start_span("view"))
    payload = {"order": 1, "total": "9.99", "lines": [1, 2, 3]}
    with span:
        for _ in range(2):  # the first one warms up
            with transaction.atomic():
                started = time.perf_counter()
                for _ in range(sends):
                    outbox.send("probe.bench", payload)
                elapsed = time.perf_counter() - started
                transaction.set_rollback(True)
    leaked = [m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None]
    common.write_json(output, {"variant": variant, "per_send_us": elapsed / sends * 1e6, "otel_modules": len(leaked)})


def send_cost(sends: int, rounds: int) -> common.Json:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DEBUG": "false", "PYTHONPATH": str(ROOT)}
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"], env["SQLITE_PATH"] = "", str(Path(tmp) / "bench.sqlite3")
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env, check=True, cwd=ROOT)
        for _ in range(rounds):
            for variant in VARIANTS:
                row = common.child_json([__file__, "--child", variant, "--sends", str(sends)], flag="--json", env=env)
                if variant == "without" and row["otel_modules"]:
                    raise SystemExit("opentelemetry was imported although it is not installed")
                results[variant].append(row["per_send_us"])
    fastest = {v: min(r) for v, r in results.items()}
    for variant, runs in results.items():
        print(
            f"{variant:<10} fastest {fastest[variant]:7.1f} us/send  x{fastest[variant] / fastest['reference']:.3f}"
            f" of reference  (median {common.median(runs):.1f}; rounds {' '.join(f'{r:.1f}' for r in runs)})"
        )
    return {
        "per_send_us": {v: common.median(r) for v, r in results.items()},
        "fastest_us": fastest,
        "without_vs_reference": fastest["without"] / fastest["reference"],
    }


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    wanted = {name.split("{")[0] for _, _, name in LINES}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted:
                name = s.name + (f"{{status={s.labels['status']}}}" if "status" in s.labels else "")
                totals[name] = totals.get(name, 0.0) + s.value
    return totals


def metrics_run(seconds: float, result: Path) -> None:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_metrics_run")
    from bench import procs

    common.setup_django("default", settings="tests.settings")
    from django.db import transaction

    from django_outbox import outbox
    from django_outbox.models import Message

    Message.objects.all().delete()
    worker = procs.Proc([sys.executable, "manage.py", "outbox_worker", "--metrics-port", "0", "--concurrency", "2"])
    worker.wait_for_line("metrics on")
    url = next(m.group(1) for line in worker.lines if (m := re.search(r"metrics on (http://\S+/metrics)", line)))
    samples = []
    started = time.monotonic()
    n = 0
    try:
        while (elapsed := time.monotonic() - started) < seconds:
            # A burst every 5 s for the first 60% of the run, every third message a slow one (20 ms).
            if elapsed < seconds * 0.6 and int(elapsed * 2) % 10 == 0:
                with transaction.atomic():
                    for _ in range(400):
                        n += 1
                        payload: common.Json = {"fail_rate": 0.15}
                        if n % 40 == 0:
                            payload = {"always_fail": True}
                        elif n % 3 == 0:
                            payload["sleep"] = 0.02
                        outbox.send("probe.run", payload, max_attempts=3)
            samples.append({"t": round(elapsed, 2), **scrape(url)})
            time.sleep(0.5)
    finally:
        worker.stop()
    result.write_text(json.dumps({"sent": n, "samples": samples}, indent=1) + "\n", encoding="utf-8")
    print(f"sent {n}; {len(samples)} samples in {result}")


def plot(result: Path, picture: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(result.read_text(encoding="utf-8"))
    t = [r["t"] for r in data["samples"]]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for panel, label, name in LINES:
        v = [r.get(name, 0.0) for r in data["samples"]]
        if name.endswith("_total"):
            v = [0.0] + [max(0.0, (b - a) / (t2 - t1)) for a, b, t1, t2 in zip(v, v[1:], t, t[1:], strict=False)]
        if name.endswith("_busy"):
            axes[panel].step(t, v, label=label, where="post")
        else:
            axes[panel].plot(t, v, label=label)
    for ax, ylabel in zip(axes, PANELS, strict=True):
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3)
    axes[2].set_xlabel("seconds into the run")
    fig.suptitle(f"outbox_worker --metrics-port, scraped every 0.5 s ({data['sent']} messages sent in bursts)")
    fig.tight_layout()
    fig.savefig(picture, dpi=80)
    print(f"wrote {picture}")


def main() -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--json", type=Path, help="the figures (--metrics-run: its samples, drawn beside)")
    parser.add_argument("--metrics-run", action="store_true", help="a real worker's metrics instead, drawn")
    parser.add_argument("--seconds", type=float, default=40.0, help="of the metrics run")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.sends, args.json)
    elif args.metrics_run:
        result = args.json or ROOT / "bench" / "results" / "metrics-run.json"
        metrics_run(args.seconds, result)
        plot(result, result.with_suffix(".png") if args.json else ROOT / "docs" / "img" / "metrics-run.png")
    else:
        figures = send_cost(args.sends, args.rounds)
        if args.json:
            common.write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
