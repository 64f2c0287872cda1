"""Terminal tables for ``astraflow stats`` (``--json`` prints ``RunStats.to_dict()`` instead)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from astraflow.analysis.hops import VersionChain
from astraflow.analysis.stats import RunStats

BAR_WIDTH = 40


def render_stats(stats: RunStats) -> Group:
    """Every section of the snapshot as rich tables, in the order of the module docstring of ``stats``."""
    throughput = Table(title=f"run {stats.run}: throughput (run span {stats.span_s:.0f} s)", title_justify="left")
    for name in ("topic", "appended", "retained", "rec/s (run)", f"rec/s (last {stats.window_s:.0f} s)"):
        throughput.add_column(name, justify="left" if name == "topic" else "right")
    for row in stats.throughput:
        throughput.add_row(
            row.topic, str(row.appended), str(row.retained), f"{row.per_s:.2f}", f"{row.recent_per_s:.2f}"
        )

    lag = Table(title="consumer-group lag", title_justify="left")
    for name in ("group", "topic", "committed", "lag"):
        lag.add_column(name, justify="left" if name in ("group", "topic") else "right")
    for row in stats.lag:
        lag.add_row(row.group, row.topic, str(row.committed), str(row.lag))

    staleness = Table(title="staleness histogram (groups judged by the stream processor)", title_justify="left")
    for name in ("versions behind", "groups", ""):
        staleness.add_column(name, justify="right" if name else "left")
    peak = max(stats.staleness.values(), default=1)
    for behind, count in stats.staleness.items():
        staleness.add_row(str(behind), str(count), "█" * max(1, round(BAR_WIDTH * count / peak)))

    rewards = Table(title="reward by policy and version (trajectory min_version)", title_justify="left")
    for name in ("policy", "version", "trajectories", "mean reward", "pass rate"):
        rewards.add_column(name, justify="left" if name == "policy" else "right")
    for cell in stats.rewards:
        rewards.add_row(
            cell.policy, str(cell.version), str(cell.trajectories), f"{cell.mean_reward:.3f}", f"{cell.pass_rate:.3f}"
        )

    drops = Table(title="drop reasons", title_justify="left")
    for name in ("source", "reason", "count"):
        drops.add_column(name, justify="right" if name == "count" else "left")
    for reason, count in stats.drops.items():
        drops.add_row("stream filter", reason, str(count))
    for reason, count in stats.dead_letters.items():
        drops.add_row("dead letter", reason, str(count))
    if stats.forged:
        drops.add_row("forged (ignored)", "metric or dead letter its writer may not write", str(stats.forged))
    producers = Table(title="rollout producers", title_justify="left")
    for name in (
        "producer",
        "region",
        "hardware",
        "trajectories",
        "traj/s (run)",
        f"traj/s (last {stats.window_s:.0f} s)",
        "version lag",
        "mean lag",
    ):
        producers.add_column(name, justify="left" if name in ("producer", "region", "hardware") else "right")
    for p in stats.producers:
        producers.add_row(
            p.producer,
            p.region,
            p.hardware,
            str(p.trajectories),
            f"{p.per_s:.2f}",
            f"{p.recent_per_s:.2f}",
            f"{p.version_lag:.0f}",
            f"{p.mean_version_lag:.2f}",
        )
    return Group(throughput, lag, staleness, rewards, drops, producers, *map(render_chain, stats.version_chain))


def render_chain(chain: VersionChain) -> Table:
    """One policy's version chain: a row per hop, its p50, p99 and mean over the versions counted."""
    skipped = ", ".join(f"{count} {reason}" for reason, count in chain.skipped.items())
    adds_up = (
        "published -> released ... in samples -> trained add up to the period (their means exactly)"
        if chain.lockstep
        else "mode async: several versions in flight, so the hops overlap (some may be negative) and are no"
        " critical path of a version"
    )
    table = Table(
        title=f"version chain (ms) of {chain.policy}: {chain.versions} versions",
        title_justify="left",
        caption=(f"skipped {skipped}. " if skipped else "") + adds_up,
        caption_justify="left",
    )
    for name in ("hop", "p50", "p99", "mean", "versions"):
        table.add_column(name, justify="left" if name == "hop" else "right")
    depth: dict[str | None, int] = {}
    for row in chain.hops:
        depth[row.hop] = depth.get(row.part_of, -1) + 1
        figures = (f"{row.p50_ms:.0f}", f"{row.p99_ms:.0f}", f"{row.mean_ms:.0f}") if row.versions else ("-",) * 3
        table.add_row("  " * depth[row.hop] + row.hop, *figures, str(row.versions))
    return table
