"""The files of ``astraflow report``: one PNG per view, and ``report.html`` with all of them inlined.

Views (a view without data still renders, with a note, so every run yields the same files):

- ``reward.png``: mean trajectory reward per weight version for each policy, and the stream
  processor's group reward over wall time (rolling mean of 50);
- ``accuracy.png``: held-out exact match (``eval.accuracy``) per weight version;
- ``staleness.png``: histogram of ``stream.staleness`` and its rolling mean over wall time;
- ``throughput.png``: records/s of each trajectories and samples topic over wall time (from
  record timestamps), and each producer's own ``rollout.samples_per_s``;
- ``version_lag.png``: ``rollout.version_lag`` per producer instance over wall time;
- ``report.png``: the overview ``astraflow run`` writes when it ends (``report.plot_overview``).

``report.html`` needs no other file: the images are base64 data URIs.
"""

from __future__ import annotations

import base64
import html
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from astraflow.analysis.report import plot_overview, smooth
from astraflow.analysis.report_data import ReportData
from astraflow.core.metric_names import (
    EVAL_ACCURACY,
    ROLLOUT_SAMPLES_PER_S,
    ROLLOUT_VERSION_LAG,
    STREAM_GROUP_REWARD,
    STREAM_STALENESS,
)

VIEWS = {
    "reward.png": "Reward by weight version and over time",
    "accuracy.png": "Held-out accuracy",
    "staleness.png": "Staleness (trainer version minus the group's oldest token version)",
    "throughput.png": "Throughput",
    "version_lag.png": "Version lag per rollout producer",
}


def write_report_files(data: ReportData, out: Path) -> list[Path]:
    """Render every view and the HTML page into ``out``; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    draw = {
        "reward.png": _reward,
        "accuracy.png": _accuracy,
        "staleness.png": _staleness,
        "throughput.png": _throughput,
        "version_lag.png": _version_lag,
    }
    written = []
    for name, title in VIEWS.items():
        fig, axes = (
            plt.subplots(1, 2, figsize=(11, 4))
            if name in ("reward.png", "staleness.png", "throughput.png")
            else plt.subplots(figsize=(7, 4))
        )
        draw[name](data, np.atleast_1d(axes))
        fig.suptitle(f"{data.run}: {title}")
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(out / name)
    plot_overview(data.metrics, out / "report.png")
    written.append(out / "report.png")
    (out / "report.html").write_text(_page(data, out))
    return written + [out / "report.html"]


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes, color="grey")


def _reward(data: ReportData, axes) -> None:
    left, right = axes
    for policy, points in sorted(data.rewards.items()):
        by_version: dict[int, list[float]] = defaultdict(list)
        for version, reward in zip(points.version, points.reward):
            by_version[version].append(reward)
        versions = sorted(by_version)
        left.plot(versions, [np.mean(by_version[v]) for v in versions], marker="o", ms=3, label=policy)
    if data.rewards:
        left.legend()
    else:
        _empty(left, "trajectories")
    left.set(xlabel="weight version (trajectory min_version)", ylabel="mean trajectory reward")
    rows = sorted(data.metrics.get(STREAM_GROUP_REWARD, []), key=lambda r: r["wall_s"])
    if rows:
        xs, ys = smooth([r["wall_s"] for r in rows], [r["value"] for r in rows], window=50)
        right.plot(xs, ys, color="tab:orange")
    else:
        _empty(right, f"{STREAM_GROUP_REWARD} metrics")
    right.set(xlabel="wall time (s)", ylabel="mean group reward (rolling 50)")
    for ax in axes:
        ax.grid(alpha=0.3)


def _accuracy(data: ReportData, axes) -> None:
    (ax,) = axes
    series: dict[str, list[dict]] = defaultdict(list)
    for row in data.metrics.get(EVAL_ACCURACY, []):
        series[row["labels"].get("policy", "")].append(row)
    for policy, rows in sorted(series.items()):
        rows.sort(key=lambda r: r["step"])
        ax.plot([r["step"] for r in rows], [r["value"] for r in rows], marker="o", ms=3, label=policy or None)
    if not series:
        _empty(ax, f"{EVAL_ACCURACY} metrics")
    ax.set(xlabel="weight version", ylabel="held-out exact match", ylim=(0, 1.02))
    ax.grid(alpha=0.3)


def _staleness(data: ReportData, axes) -> None:
    left, right = axes
    rows = sorted(data.metrics.get(STREAM_STALENESS, []), key=lambda r: r["wall_s"])
    if rows:
        values = [int(r["value"]) for r in rows]
        left.hist(values, bins=np.arange(min(values), max(values) + 2) - 0.5, rwidth=0.8)
        xs, ys = smooth([r["wall_s"] for r in rows], [float(v) for v in values], window=50)
        right.plot(xs, ys, color="tab:purple")
    else:
        _empty(left, f"{STREAM_STALENESS} metrics")
        _empty(right, f"{STREAM_STALENESS} metrics")
    left.set(xlabel="versions behind", ylabel="groups")
    right.set(xlabel="wall time (s)", ylabel="staleness (rolling 50)")
    for ax in axes:
        ax.grid(alpha=0.3)


def _throughput(data: ReportData, axes) -> None:
    left, right = axes
    for topic, times in sorted(data.arrivals.items()):
        if len(times) < 2:
            continue
        width = max(1.0, (times[-1] - times[0]) / 60)
        counts, edges = np.histogram(times, bins=np.arange(times[0], times[-1] + width, width))
        left.step(edges[:-1], counts / width, where="post", label=topic)
    if any(len(times) >= 2 for times in data.arrivals.values()):
        left.legend(fontsize=7)
    else:
        _empty(left, "trajectory or sample records")
    left.set(xlabel="wall time (s)", ylabel="records/s appended")
    _per_instance(right, data.metrics.get(ROLLOUT_SAMPLES_PER_S, []), f"{ROLLOUT_SAMPLES_PER_S} metrics")
    right.set(xlabel="wall time (s)", ylabel="samples/s per producer")


def _version_lag(data: ReportData, axes) -> None:
    (ax,) = axes
    _per_instance(ax, data.metrics.get(ROLLOUT_VERSION_LAG, []), f"{ROLLOUT_VERSION_LAG} metrics", step=True)
    ax.set(xlabel="wall time (s)", ylabel="newest published version - version in use")


def _per_instance(ax, rows: list[dict], what: str, step: bool = False) -> None:
    series: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        series[row["labels"].get("instance", row["component"])].append(row)
    for instance, points in sorted(series.items()):
        points.sort(key=lambda r: r["wall_s"])
        plot = ax.step if step else ax.plot
        plot(
            [r["wall_s"] for r in points],
            [r["value"] for r in points],
            label=instance,
            **({"where": "post"} if step else {}),
        )
    if series:
        ax.legend(fontsize=7)
    else:
        _empty(ax, what)
    ax.grid(alpha=0.3)


def _page(data: ReportData, out: Path) -> str:
    accuracy = data.latest(EVAL_ACCURACY)
    facts = [
        ("run", data.run),
        ("data from", data.source),
        ("rendered", time.strftime("%Y-%m-%d %H:%M:%S")),
        ("trajectories", ", ".join(f"{p}: {len(r.reward)}" for p, r in sorted(data.rewards.items())) or "-"),
        ("latest held-out accuracy", f"{accuracy['value']:.3f} at version {accuracy['step']}" if accuracy else "-"),
    ]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    figures = "".join(
        f'<h2>{html.escape(title)}</h2><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode((out / name).read_bytes()).decode()}">'
        for name, title in {**VIEWS, "report.png": "Overview"}.items()
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>AstraFlow report: {html.escape(data.run)}</title>"
        "<style>body{font-family:sans-serif;max-width:1150px;margin:auto}img{max-width:100%}"
        "th{text-align:left;padding-right:1em}</style></head><body>"
        f"<h1>AstraFlow run {html.escape(data.run)}</h1><table>{table}</table>{figures}</body></html>\n"
    )
