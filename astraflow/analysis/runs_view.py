"""Terminal tables for ``astraflow runs ls`` and ``astraflow runs show``."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from astraflow.analysis.runs import RunInfo

SUMMARY_KEYS = ("base_accuracy", "final_accuracy", "best_accuracy", "versions", "trajectories", "wall_seconds")


def render_runs(infos: list[RunInfo]) -> Table:
    table = Table(title="runs", title_justify="left")
    for name in ("run", "backend", "status", "topics", "trajectories", "directory"):
        table.add_column(name, justify="right" if name in ("topics", "trajectories") else "left")
    for info in infos:
        topics = str(len(info.topics)) if info.topics else "-"
        table.add_row(
            info.name,
            info.backend,
            info.status,
            topics,
            str(info.appended("trajectories")),
            str(info.run_dir) if info.run_dir else "-",
        )
    return table


def render_run(info: RunInfo) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row("run", info.name)
    head.add_row("backend", info.backend)
    head.add_row("status", info.status)
    head.add_row("directory", str(info.run_dir) if info.run_dir else "-")
    for key in SUMMARY_KEYS:
        if key in info.summary:
            value = info.summary[key]
            head.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))

    topics = Table(title="topics", title_justify="left")
    for name in ("topic", "partitions", "retention", "appended", "retained"):
        topics.add_column(name, justify="left" if name == "topic" else "right")
    for topic in info.topics:
        retention = "forever" if topic.retention_ms is None else f"{topic.retention_ms / 3_600_000:.1f} h"
        topics.add_row(topic.name, str(topic.partitions), retention, str(topic.appended), str(topic.retained))

    groups = Table(title="consumer groups", title_justify="left")
    for name in ("group", "topic", "committed", "lag"):
        groups.add_column(name, justify="left" if name in ("group", "topic") else "right")
    for row in info.groups:
        groups.add_row(row.group, row.topic, str(row.committed), str(row.lag))
    return Group(head, topics, groups)
