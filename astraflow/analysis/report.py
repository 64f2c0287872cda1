"""``report.png``: reward and held-out accuracy against wall time and against weight version.

Reads ``metrics.jsonl`` as written by the run monitor (one JSON object per metric record), so it
works on a finished run and on one still going.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from astraflow.core.metric_names import EVAL_ACCURACY, STREAM_GROUP_REWARD


def load_metrics(path: Path) -> dict[str, list[dict]]:
    """Metric rows grouped by metric name."""
    rows: dict[str, list[dict]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["name"]].append(row)
    return rows


def write_report(metrics_path: Path, png_path: Path) -> None:
    plot_overview(load_metrics(metrics_path), png_path)


def plot_overview(rows: dict[str, list[dict]], png_path: Path) -> None:
    """The 2x2 overview from metric rows grouped by name (the shape ``load_metrics`` returns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = sorted(rows.get(EVAL_ACCURACY, []), key=lambda r: r["step"])
    reward = sorted(rows.get(STREAM_GROUP_REWARD, []), key=lambda r: r["wall_s"])
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for column, x_key, x_label in ((0, "wall_s", "wall time (s)"), (1, "step", "weight version")):
        top, bottom = axes[0][column], axes[1][column]
        top.plot([r[x_key] for r in acc], [r["value"] for r in acc], marker="o", ms=3)
        top.set_ylabel("held-out exact match")
        top.set_ylim(0, 1.02)
        top.grid(alpha=0.3)
        xs, ys = smooth([r[x_key] for r in reward], [r["value"] for r in reward], window=50)
        bottom.plot(xs, ys, color="tab:orange")
        bottom.set_ylabel("mean group reward (rolling 50)")
        bottom.set_xlabel(x_label)
        bottom.set_ylim(0, 1.02)
        bottom.grid(alpha=0.3)
    fig.suptitle("AstraFlow run: held-out accuracy and reward")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def smooth(xs: list[float], ys: list[float], window: int) -> tuple[list[float], list[float]]:
    """``ys`` as a trailing rolling mean over ``window`` points (shorter at the start)."""
    out = []
    total = 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return xs, out
