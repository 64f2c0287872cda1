"""The run monitor's stop conditions, and its progress lines off a terminal."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from astraflow.config import load_config
from astraflow.core.metric_names import EVAL_ACCURACY, ROLLOUT_VERSION_LAG, TRAIN_VERSION, TRAIN_WAIT_SECONDS
from astraflow.infra.launch.monitor import RunMonitor
from astraflow.infra.launch.progress import ProgressLines
from astraflow.log import open_log
from astraflow.runtime.context import ComponentContext
from astraflow.runtime.topics import RunTopics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_target_gain_waits_for_two_evaluations_of_every_policy(tmp_path: Path) -> None:
    config = load_config(EXAMPLES / "solver_verifier" / "config.yaml")
    config = config.model_copy(update={"stop": config.stop.model_copy(update={"target_gain": 0.05})})
    topics = RunTopics(config.run, config.workflow, tuple(config.policy_names()))
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        topics.ensure(log, partitions=1)
        monitor = RunMonitor(config, tmp_path, log, topics)
        solver, verifier = (monitor.policy_accuracy[name] for name in ("solver", "verifier"))
        solver.update({0: 0.40, 10: 0.50})
        verifier.update({0: 0.60, 10: 0.70, 20: 0.70})
        assert monitor.done() is None  # the solver has one evaluation after its base
        solver[20] = 0.38
        assert monitor.gain("solver") < 0.05 and monitor.done() is None  # (0.50 + 0.38) / 2 = 0.44
        solver[30] = 0.54
        assert monitor.done() == "every policy's held-out accuracy gained 0.05 over its base"  # 0.46 and 0.70
        verifier[30] = 0.58
        assert monitor.done() is None  # the verifier's last two fell to 0.64
        monitor.out.close()
        monitor.consumer.close()


def test_progress_lines_every_ten_seconds_from_the_metrics_topic(tmp_path: Path) -> None:
    config = load_config(EXAMPLES / "solver_verifier" / "config.yaml")
    topics = RunTopics(config.run, config.workflow, tuple(config.policy_names()))
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        topics.ensure(log, partitions=1)
        ctx = ComponentContext(config, tmp_path, "test")
        ctx.metric(TRAIN_VERSION, 17, 17, policy="solver")
        ctx.metric(TRAIN_WAIT_SECONDS, 0.41, 17, policy="solver")
        ctx.metric(ROLLOUT_VERSION_LAG, 3, 14, policy="solver")
        ctx.metric(EVAL_ACCURACY, 0.62, 15, policy="solver")
        ctx.metric(TRAIN_VERSION, 9, 9, policy="verifier")
        ctx.close()
        monitor = RunMonitor(config, tmp_path, log, topics)
        monitor._consume(timeout=1.0)
        out = io.StringIO()
        view = ProgressLines(monitor, Console(file=out, width=40))  # narrow: a line must not wrap

        def refresh_at(seconds: float, solver: int, verifier: int) -> None:
            ends = {topics.trajectories("solver"): solver, topics.trajectories("verifier"): verifier}
            monitor.ends = (monitor.started + seconds, ends)
            view.refresh([])

        with view:
            refresh_at(1.0, 0, 0)
            refresh_at(9.0, 400, 0)
            assert out.getvalue() == ""
            refresh_at(11.0, 850, 100)  # the rates are over the 10 s since the first sample
            monitor.notes.append("stream-solver exited with 1; restarted")
            refresh_at(12.0, 900, 100)
            refresh_at(12.5, 900, 100)  # a note is printed once
            refresh_at(21.0, 1850, 100)
            refresh_at(25.0, 2250, 140)  # the run stops: one last line
        assert out.getvalue().splitlines() == [
            "[  11 s] solver: v17  heldout 0.620 (v15)  traj/s 85  trainer wait 0.41 s  lag 3"
            "  |  verifier: v9  heldout -  traj/s 10  trainer wait -  lag -",
            "[  12 s] stream-solver exited with 1; restarted",
            "[  21 s] solver: v17  heldout 0.620 (v15)  traj/s 100  trainer wait 0.41 s  lag 3"
            "  |  verifier: v9  heldout -  traj/s 0  trainer wait -  lag -",
            "[  25 s] solver: v17  heldout 0.620 (v15)  traj/s 100  trainer wait 0.41 s  lag 3"
            "  |  verifier: v9  heldout -  traj/s 10  trainer wait -  lag -",
        ]
        monitor.out.close()
        monitor.consumer.close()
