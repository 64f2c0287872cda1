"""The run monitor's stop conditions."""

from __future__ import annotations

from pathlib import Path

from astraflow.config import load_config
from astraflow.launch.monitor import RunMonitor
from astraflow.log import open_log
from astraflow.topics import RunTopics

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
