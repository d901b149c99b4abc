"""A real worker's metrics over a short run, scraped from its ``/metrics``: the data of docs/img/metrics-run.png.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_metrics_run python bench/metrics_run.py [--seconds 40]
    python3 bench/metrics_run.py --plot          (needs matplotlib; reads the JSON the run wrote)

The run migrates the database, starts ``outbox_worker --metrics-port 0`` on the probe handlers of the test
settings, sends bursts of messages (some fail at random and are retried, some fail for good), and
scrapes the worker every half second; the samples go to ``bench/results/metrics-run.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "metrics-run.json"
PICTURE = ROOT / "docs" / "img" / "metrics-run.png"
WANTED = (
    "outbox_messages_delivered_total",
    "outbox_messages_failed_total",
    "outbox_messages_dead_total",
    "outbox_lag_seconds",
    "outbox_backlog_messages",
    "outbox_worker_threads_busy",
    "outbox_delivery_duration_seconds_sum",
    "outbox_delivery_duration_seconds_count",
)


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in WANTED:
                name = s.name + (f"{{status={s.labels['status']}}}" if "status" in s.labels else "")
                totals[name] = totals.get(name, 0.0) + s.value
    return totals


def run(seconds: float) -> None:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox_metrics_run")
    sys.path.insert(0, str(ROOT))
    from bench import common, procs

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
    try:
        n = 0
        while (elapsed := time.monotonic() - started) < seconds:
            # A burst every 5 s for the first 60% of the run, every third message a slow one (20 ms).
            if elapsed < seconds * 0.6 and int(elapsed * 2) % 10 == 0:
                with transaction.atomic():
                    for _ in range(400):
                        n += 1
                        payload = {"fail_rate": 0.15}
                        if n % 40 == 0:
                            payload = {"always_fail": True}
                        elif n % 3 == 0:
                            payload["sleep"] = 0.02
                        outbox.send("probe.run", payload, max_attempts=3)
            samples.append({"t": round(elapsed, 2), **scrape(url)})
            time.sleep(0.5)
    finally:
        worker.stop()
    RESULT.write_text(json.dumps({"sent": n, "samples": samples}, indent=1) + "\n", encoding="utf-8")
    print(f"sent {n}; {len(samples)} samples in {RESULT.relative_to(ROOT)}")


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(RESULT.read_text(encoding="utf-8"))
    rows = data["samples"]
    t = [r["t"] for r in rows]

    def series(name: str) -> list[float]:
        return [r.get(name, 0.0) for r in rows]

    def rate(name: str) -> list[float]:
        values = series(name)
        return [0.0] + [
            max(0.0, (b - a) / (t2 - t1)) for a, b, t1, t2 in zip(values, values[1:], t, t[1:], strict=False)
        ]

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].plot(t, rate("outbox_messages_delivered_total"), label="delivered / s")
    axes[0].plot(t, rate("outbox_messages_failed_total"), label="failed attempts / s")
    axes[0].plot(t, rate("outbox_messages_dead_total"), label="dead / s")
    axes[0].set_ylabel("rate (from the _total counters)")
    axes[1].plot(t, series("outbox_backlog_messages{status=pending}"), label="backlog: pending")
    axes[1].plot(t, series("outbox_backlog_messages{status=dead}"), label="backlog: dead")
    axes[1].set_ylabel("messages (sampled every 5 s)")
    axes[2].plot(t, series("outbox_lag_seconds"), label="outbox_lag_seconds")
    axes[2].step(t, series("outbox_worker_threads_busy"), label="outbox_worker_threads_busy", where="post")
    axes[2].set_ylabel("seconds / threads")
    axes[2].set_xlabel("seconds into the run")
    for ax in axes:
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3)
    fig.suptitle(f"outbox_worker --metrics-port, scraped every 0.5 s ({data['sent']} messages sent in bursts)")
    fig.tight_layout()
    fig.savefig(PICTURE, dpi=80)
    print(f"wrote {PICTURE.relative_to(ROOT)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--json", type=Path, help=f"where the samples go (default {RESULT.relative_to(ROOT)})")
    args = parser.parse_args()
    if args.json:
        RESULT = args.json
    plot() if args.plot else run(args.seconds)
