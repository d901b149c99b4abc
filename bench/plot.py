"""The drain figure as a picture: messages per second against worker processes, from a run's JSON.

    python bench/plot.py bench/results/<run>.json [docs/img/drain-vs-processes.png]

Draws the project and both references of ``bench/run.py``'s drain section (the minimal relay on the
minimal table, the hand-written relay on the project's own table), each point the median of the
repetitions with a bar from the slowest to the fastest, and the peers when the run measured them.
``bench/run.py`` calls :func:`draw` itself after each run that measured the drain.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "docs" / "img" / "drain-vs-processes.png"
SERIES = (
    ("outbox", "django-transactional-outbox", "#1565c0", "o"),
    ("minimal", "minimal relay, minimal table", "#2e7d32", "s"),
    ("baseline", "hand-written relay, project's table", "#ef6c00", "^"),
)


def draw(results: dict[str, Any], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drain = results["figures"]["drain"]
    by = drain["by_processes"]
    processes = sorted(int(p) for p in by)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for name, label, colour, marker in SERIES:
        medians = [by[str(p)][f"{name}_per_s"] for p in processes]
        reps = [[r[name] for r in by[str(p)]["reps"]] for p in processes]
        low = [m - min(r) for m, r in zip(medians, reps, strict=True)]
        high = [max(r) - m for m, r in zip(medians, reps, strict=True)]
        ax.errorbar(processes, medians, yerr=[low, high], label=label, color=colour, marker=marker, capsize=4)
    peers = [(n, p) for n, p in results["figures"].get("compare", {}).items() if isinstance(p, dict)]
    greys = ("#424242", "#757575", "#9e9e9e", "#bdbdbd", "#616161")
    for (name, peer), grey in zip(peers, greys * 2, strict=False):
        if all(str(p) in peer for p in processes):
            ax.plot(
                processes, [peer[str(p)]["per_s"] for p in processes], label=name, color=grey, linestyle=":", marker="."
            )
    ax.set_xticks(processes)
    ax.set_xlabel("worker processes")
    ax.set_ylabel("messages per second (no-op handler)")
    ax.set_ylim(bottom=0)
    env = results.get("environment", {})
    pg = env.get("postgresql", {}).get("server_version", "?")
    ax.set_title(
        f"Drain of {drain['messages']:,} messages, medians of {len(by[str(processes[0])]['reps'])} "
        f"(bars: min-max)\nPostgreSQL {pg}, {env.get('cpus', '?')} cores",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)


def main() -> int:
    source = Path(sys.argv[1])
    output = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT
    draw(json.loads(source.read_text()), output)
    print(f"drew {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
