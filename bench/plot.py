"""The drain figure as a picture: messages per second against worker processes, from a run's JSON.

    python bench/plot.py bench/results/<run>.json [docs/img/drain-vs-processes.png]

Each point the median of the repetitions, with a bar from the slowest to the fastest; the peers when the run
measured them. bench/run.py calls :func:`draw`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PICTURE = Path(__file__).resolve().parent.parent / "docs" / "img" / "drain-vs-processes.png"
SERIES = (
    ("outbox", "django-transactional-outbox", "#1565c0", "o"),
    ("minimal", "minimal relay, minimal table", "#2e7d32", "s"),
    ("baseline", "hand-written relay, project's table", "#ef6c00", "^"),
)
GREYS = ("#424242", "#757575", "#9e9e9e", "#bdbdbd", "#616161")


def draw(results: dict[str, Any], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drain, env = results["figures"]["drain"], results.get("environment", {})
    by = {int(p): figure for p, figure in drain["by_processes"].items()}
    processes = sorted(by)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for name, label, colour, marker in SERIES:
        medians = [by[p][f"{name}_per_s"] for p in processes]
        low = [m - min(r[name] for r in by[p]["reps"]) for m, p in zip(medians, processes, strict=True)]
        high = [max(r[name] for r in by[p]["reps"]) - m for m, p in zip(medians, processes, strict=True)]
        ax.errorbar(processes, medians, yerr=[low, high], label=label, color=colour, marker=marker, capsize=4)
    peers = [(name, peer) for name, peer in results["figures"].get("compare", {}).items() if isinstance(peer, dict)]
    for (name, peer), grey in zip(peers, GREYS * 2, strict=False):
        if all(str(p) in peer for p in processes):
            rates = [peer[str(p)]["per_s"] for p in processes]
            ax.plot(processes, rates, label=name, color=grey, linestyle=":", marker=".")
    ax.set(xticks=processes, xlabel="worker processes", ylabel="messages per second (no-op handler)", ylim=(0, None))
    ax.set_title(
        f"Drain of {drain['messages']:,} messages, medians of {len(by[processes[0]]['reps'])} (bars: min-max)\n"
        f"PostgreSQL {env.get('postgresql', {}).get('server_version', '?')}, {env.get('cpus', '?')} cores",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)


if __name__ == "__main__":
    draw(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]) if len(sys.argv) > 2 else PICTURE)
