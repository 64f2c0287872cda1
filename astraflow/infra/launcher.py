"""``astraflow run``: every component as its own process on one machine, joined only by the log.

Steps:

1. Write the resolved config to ``run_dir/config.yaml`` (every child reads that file, so the
   command-line overrides reach them all) and run ``astraflow warmup`` as a child to put the base
   checkpoint in ``run_dir/base`` (cached across runs).
2. Create the run's topics, then start trainer, evaluator, stream processor, feeder and
   ``rollout.producers`` rollout producers, each ``python -m astraflow.cli <component>`` (``plan``:
   with ``policies``, a trainer, stream processor and evaluator per policy, ``--policy NAME``,
   and for a multi-policy workflow a system evaluator ``evaluate --system``); with
   ``scaler.enabled`` also the scaler, and the producer pool (``pool.py``) follows its
   ``scaler.desired_producers`` decisions within ``scaler.min_producers..max_producers``.
3. Follow the metrics topic (``RunMonitor``): append every metric to ``metrics.jsonl``, show the
   dashboard, and stop on ``stop.max_minutes``, ``stop.target_accuracy``, ``stop.max_versions``
   or Ctrl-C. A component that exits on its own is restarted (at most ``MAX_RESTARTS`` times).
4. SIGTERM every child (they finish their step and flush), SIGKILL stragglers, drain the last
   metrics, and write ``summary.json`` and ``report.png``.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

from astraflow.config import RunConfig, dump_config
from astraflow.context import open_run_log
from astraflow.errors import AstraFlowError
from astraflow.infra.monitor import RunMonitor
from astraflow.infra.pool import ProducerPool
from astraflow.infra.scaler import capped
from astraflow.topics import RunTopics

logger = logging.getLogger(__name__)
MAX_RESTARTS = 3


class Child:
    """One component process and how often it has been restarted."""

    def __init__(self, name: str, argv: list[str], run_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.run_dir = run_dir
        self.restarts = 0
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        log_path = self.run_dir / "logs" / f"{self.name}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            return subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def check(self) -> str | None:
        """Restart the process if it ended; return a note for the dashboard when it did."""
        code = self.process.poll()
        if code is None:
            return None
        if self.restarts >= MAX_RESTARTS:
            return f"{self.name} exited with {code}; restart budget spent"
        self.restarts += 1
        logger.warning("%s exited with %s; restarting (%d/%d)", self.name, code, self.restarts, MAX_RESTARTS)
        self.process = self._start()
        return f"{self.name} exited with {code}; restarted"

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> None:
        try:
            self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in time; killing it", self.name)
            self.process.kill()
            self.process.wait()


def _argv(component: str, config_path: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "astraflow.cli", component, str(config_path), "--run-dir", str(run_dir), *extra]


def plan(config: RunConfig) -> list[tuple[str, tuple[str, ...]]]:
    """The long-running components of a run, as (child name, (command, *options)), producers aside."""
    if not config.policies:
        components = [(name, (name,)) for name in ("train", "evaluate", "stream")]
    else:
        components = [(f"{name}-{policy}", (name, "--policy", policy)) for policy in config.policy_names() for name in ("train", "stream", "evaluate")]
        if len(config.policies) > 1 and config.rollout.workflow == "solver_verifier":
            components.append(("evaluate-system", ("evaluate", "--system")))
    components.append(("feed", ("feed",)))
    if config.scaler.enabled:
        components.append(("scale", ("scale",)))
    return components


def launch(config: RunConfig, run_dir: Path, dashboard: bool = True) -> dict:
    """Run the whole system until a stop condition; return the summary written to summary.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    dump_config(config, config_path)
    started = time.monotonic()
    warm = subprocess.run(_argv("warmup", config_path, run_dir), check=False)
    if warm.returncode != 0:
        raise AstraFlowError(f"warm-up failed with exit code {warm.returncode}; see {run_dir / 'logs'}")
    warmup_seconds = time.monotonic() - started

    topics = RunTopics(config.run, config.workflow, config.policy_names())
    log = open_run_log(config, run_dir)
    topics.ensure(log, config.log.partitions)
    monitor = RunMonitor(config, run_dir, log, topics)
    children = [Child(name, _argv(command, config_path, run_dir, *options), run_dir) for name, (command, *options) in plan(config)]
    bounds = capped(config.scaler, config.log.partitions) if config.scaler.enabled else None
    pool = ProducerPool(lambda name: Child(name, _argv("rollout", config_path, run_dir, "--region", "local"), run_dir), children,
                        config.rollout.producers, bounds.min_producers if bounds else 1, bounds.max_producers if bounds else 64)
    interrupted = False
    try:
        monitor.follow(children, dashboard=dashboard, on_refresh=(lambda: pool.resize(monitor.producers.desired)) if bounds else pool.reap)
    except KeyboardInterrupt:
        interrupted = True
        logger.info("interrupted; stopping the components")
    finally:
        for child in children + pool.retiring:
            child.terminate()
        deadline = time.monotonic() + 30
        for child in children + pool.retiring:
            child.wait(deadline)
    monitor.drain()
    summary = monitor.summary(warmup_seconds=warmup_seconds, interrupted=interrupted)
    summary["producer_seconds"] = pool.producer_seconds()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    from astraflow.consumers.report import write_report

    write_report(run_dir / "metrics.jsonl", run_dir / "report.png")
    log.close()
    return summary
