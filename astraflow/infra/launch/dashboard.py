"""The live dashboard of ``astraflow run`` on a terminal (rich): version, accuracy, reward, staleness,
rates, and per rollout producer its region, hardware, throughput and version lag, with the scaler's
decision. Off a terminal the run prints ``progress.py``'s lines instead."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from astraflow.core.metric_names import STREAM_STALENESS, TRAIN_STEP_SECONDS


class Dashboard:
    """Renders a ``RunMonitor``'s state in place on ``console``, a terminal."""

    def __init__(self, monitor, console: Console) -> None:
        self.monitor = monitor
        self.live = Live(console=console, auto_refresh=False)

    def __enter__(self) -> "Dashboard":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def refresh(self, children: list) -> None:
        m = self.monitor
        status = Table(title=f"AstraFlow run '{m.config.run}' on the {m.config.log.backend} log", show_header=False)
        acc = m.accuracy
        base = acc.get(0)
        latest = acc[max(acc)] if acc else None
        reward = sum(m.rewards) / len(m.rewards) if m.rewards else None
        rows = [
            ("elapsed", f"{time.monotonic() - m.started:.0f} s of {m.config.stop.max_minutes * 60:.0f} s"),
            ("weight version", str(m.version)),
            (
                "held-out accuracy",
                "-"
                if latest is None
                else f"{latest:.3f} (base {base if base is None else f'{base:.3f}'}, best {max(acc.values()):.3f})",
            ),
            ("mean group reward (last 200)", "-" if reward is None else f"{reward:.3f}"),
            ("staleness (versions)", f"{m.latest.get(STREAM_STALENESS, 0):.0f}"),
            ("trainer step time", f"{m.latest.get(TRAIN_STEP_SECONDS, 0):.2f} s"),
        ]
        rows += [(f"records/s {name}", f"{rate:.0f}") for name, rate in m.rates.items()]
        decision = m.producers.decision
        if decision is not None:
            rows.append(("scaler: desired producers", f"{decision.desired} ({decision.rule}: {decision.reason})"))
        for key, value in rows:
            status.add_row(key, value)
        procs = Table("component", "pid", "state", "restarts")
        for child in children:
            code = child.process.poll()
            procs.add_row(
                child.name, str(child.process.pid), "running" if code is None else f"exit {code}", str(child.restarts)
            )
        producers = Table("producer", "region", "hardware", "trajectories", "traj/s (last 60 s)", "version lag")
        for row in m.producers.rows():
            producers.add_row(
                row.producer,
                row.region,
                row.hardware,
                str(row.trajectories),
                f"{row.recent_per_s:.1f}",
                f"{row.version_lag:.0f}",
            )
        self.live.update(Group(status, procs, producers, *m.notes), refresh=True)
