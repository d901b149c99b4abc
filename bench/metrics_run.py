"""A real worker's metrics, drawn for docs/operating.md.

``outbox_worker --metrics-port 0`` (DATABASE_URL: PostgreSQL) on the test settings' probe handlers, bursts of
messages (some fail at random and are retried, some for good), the worker scraped every half second into
bench/results/metrics-run.json, drawn into docs/img/metrics-run.png.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import common  # noqa: E402

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
    result.parent.mkdir(parents=True, exist_ok=True)  # indent 1: the kept file's format
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
    parser.add_argument("--json", type=Path, help="the samples (drawn beside, not into docs/img)")
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    result = args.json or ROOT / "bench" / "results" / "metrics-run.json"
    metrics_run(args.seconds, result)
    plot(result, result.with_suffix(".png") if args.json else ROOT / "docs" / "img" / "metrics-run.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
