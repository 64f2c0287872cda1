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
3. Follow the metrics topics (``RunMonitor``): append every metric its writer may write to
   ``metrics.jsonl`` (forgeries are dead-lettered, ``ForgeryReporter``), show the dashboard (on a
   terminal; otherwise a progress line every 10 s), and stop on
   ``stop.max_minutes``, ``stop.target_accuracy``, ``stop.target_gain``, ``stop.max_versions``
   or Ctrl-C (or SIGTERM). A component that exits on its own (a crash, ``kill -9``, a log it
   lost) is restarted and resumes from the log and its checkpoint; each restart is a
   ``launcher.restarts`` metric (labels ``child`` and ``kind``). One that exits again after
   ``MAX_RESTARTS`` restarts within ``RESTART_WINDOW_S`` is crash-looping: the run stops, failed.
4. SIGTERM every child (they finish their step and flush), SIGKILL stragglers, drain the last
   metrics, export each policy's newest checkpoint as a Hugging Face directory
   (``run_dir/final/<policy>``, ``training/export.py``), and write ``summary.json`` (with every
   child's restarts and, under ``final_models``, each exported directory and its version) and
   ``report.png``.

While a child runs, ``run_dir/pids/<child>.pid`` holds its pid (rewritten at each restart,
removed when it exited for good), so operators and fault-injection tests can signal it.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import yaml

from astraflow.analysis.report import write_report
from astraflow.config import RunConfig, dump_config
from astraflow.core.errors import AstraFlowError, LogError
from astraflow.core.metric_names import LAUNCHER_RESTARTS
from astraflow.core.rundir import RunDir
from astraflow.infra.broker.acls import grant_run
from astraflow.infra.launch.monitor import RunMonitor
from astraflow.infra.launch.pool import ProducerPool
from astraflow.log import Message, open_log
from astraflow.runtime.context import ComponentContext, open_run_log
from astraflow.runtime.topics import RunTopics
from astraflow.scaler.rule import capped
from astraflow.training.export import export_final_models

logger = logging.getLogger(__name__)
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0
"""A child restarted ``MAX_RESTARTS`` times within this many seconds and exiting again is
crash-looping (a bad config, a missing file): restarting it once more would not help."""


class CrashLoopError(AstraFlowError):
    """A child kept exiting right after its restarts; the run stops."""


class Child:
    """One component process, restarted when it exits; ``on_restart(child, exit_code)`` is told of each restart."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        run_dir: Path,
        on_restart: Callable[["Child", int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.argv = argv
        self.run_dir = run_dir
        self.on_restart = on_restart
        self.clock = clock
        self.restarts = 0
        self._recent: deque[float] = deque()
        """When the restarts of the last ``RESTART_WINDOW_S`` happened."""
        self.process = self._start()

    @property
    def kind(self) -> str:
        """The component command (``train``, ``rollout`` ...)."""
        return self.argv[3]

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "pids" / f"{self.name}.pid"

    def _start(self) -> subprocess.Popen:
        log_path = RunDir(self.run_dir).logs / f"{self.name}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(f"{process.pid}\n")
        tmp.replace(self.pid_file)
        return process

    def check(self) -> str | None:
        """Restart the process if it ended; a note for the dashboard when it did.

        Raises ``CrashLoopError`` when it ended after ``MAX_RESTARTS`` restarts within ``RESTART_WINDOW_S``.
        """
        code = self.process.poll()
        if code is None:
            return None
        now = self.clock()
        while self._recent and now - self._recent[0] > RESTART_WINDOW_S:
            self._recent.popleft()
        if len(self._recent) >= MAX_RESTARTS:
            self.pid_file.unlink(missing_ok=True)
            raise CrashLoopError(
                f"{self.name} exited with {code} after {MAX_RESTARTS} restarts within "
                f"{RESTART_WINDOW_S:.0f} s; see {RunDir(self.run_dir).logs / (self.name + '.out')}"
            )
        self._recent.append(now)
        self.restarts += 1
        logger.warning("%s exited with %s; restarting (restart %d)", self.name, code, self.restarts)
        self.process = self._start()
        if self.on_restart is not None:
            self.on_restart(self, code)
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
        self.pid_file.unlink(missing_ok=True)


class RestartRecorder:
    """Writes each restart to the metrics topic as ``launcher.restarts`` (the child's restarts so far).

    The flush is short and its failure only logged: a restart during a broker outage must not
    stop the launcher, and the Kafka producer keeps the record queued for a later flush.
    """

    def __init__(self, ctx: ComponentContext, version: Callable[[], int]) -> None:
        self.ctx = ctx
        self.version = version

    def __call__(self, child: Child, code: int) -> None:
        self.ctx.metric(
            LAUNCHER_RESTARTS, child.restarts, self.version(), child=child.name, kind=child.kind, exit_code=str(code)
        )
        try:
            self.ctx.producer.flush(timeout=5.0)
        except LogError as exc:
            logger.warning("restart of %s not recorded yet: %s", child.name, exc)


class ForgeryReporter:
    """Dead-letters each forged control-plane record the monitor finds (``runtime/control.py``), so
    ``astraflow audit`` and anyone reading the launcher's dead letters see where it was written."""

    def __init__(self, ctx: ComponentContext) -> None:
        self.ctx = ctx

    def __call__(self, message: Message, reason: str) -> None:
        self.ctx.dead_letter(message, f"forged record: {reason}")
        try:
            self.ctx.producer.flush(timeout=5.0)
        except LogError as exc:
            logger.warning("forged record not reported yet: %s", exc)


STOP_S = 30.0
"""How long the components get to finish their step and flush after SIGTERM, before SIGKILL."""
FINAL_EVAL_S = 180.0
"""How long the evaluators get after SIGTERM: to take in the last versions and score the newest (``eval.final``)."""


def stop_children(children: list[Child]) -> None:
    """SIGTERM the components and wait for them, the evaluators last: once every trainer has
    published its last version, each evaluator scores it (``eval.final``) before it exits."""
    evaluators = [child for child in children if child.kind == "evaluate"]
    others = [child for child in children if child.kind != "evaluate"]
    for group, grace in ((others, STOP_S), (evaluators, FINAL_EVAL_S)):
        for child in group:
            child.terminate()
        deadline = time.monotonic() + grace
        for child in group:
            child.wait(deadline)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _argv(component: str, config_path: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "astraflow.cli", component, str(config_path), "--run-dir", str(run_dir), *extra]


def plan(config: RunConfig) -> list[tuple[str, tuple[str, ...]]]:
    """The long-running components of a run, as (child name, (command, *options)), producers aside."""
    if not config.policies:
        components = [(name, (name,)) for name in ("train", "evaluate", "stream")]
        components += _more_instances(config, "stream", ())
    else:
        components = []
        for policy in config.policy_names():
            components += [(f"{name}-{policy}", (name, "--policy", policy)) for name in ("train", "stream", "evaluate")]
            components += _more_instances(config.for_policy(policy), f"stream-{policy}", ("--policy", policy))
        if len(config.policies) > 1 and config.rollout.workflow == "solver_verifier":
            components.append(("evaluate-system", ("evaluate", "--system")))
    if not config.eval.enabled:
        components = [(name, options) for name, options in components if options[0] != "evaluate"]
    components.append(("feed", ("feed",)))
    if config.scaler.enabled:
        components.append(("scale", ("scale",)))
    return components


def _more_instances(config: RunConfig, name: str, options: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The stream processor instances after the first (``stream.instances``), as ``plan`` lists them."""
    return [
        (f"{name}-{instance}", ("stream", *options, "--instance", str(instance)))
        for instance in range(1, config.stream.instances)
    ]


def refuse_another_runs_topics(config: RunConfig, run_dir: Path) -> None:
    """Refuse to start a Kafka run from ``run_dir`` when the run's topics already hold records that
    ``run_dir`` did not write: it has no ``metrics.jsonl``, which the launcher opens as soon as it has
    created the topics.

    On the embedded log a run's records live in its run directory, so a new directory is a new run.
    On Kafka they live in the run's topics (``{run}.*``), which outlive any directory. Started again
    under the same ``run`` name from a new directory (or after deleting the first), the components
    would resume the first run from the log, its trainer without the checkpoints of the first
    directory, and a run already past its ``stop.max_versions`` would stop at once and report the
    first run's accuracy as its own (measured before this check: "0.380 -> 0.365 in 5 versions, 3 s",
    with no final model)."""
    if config.log.backend != "kafka" or RunDir(run_dir).metrics.exists():
        return
    names = {spec.name for spec in RunTopics(config.run, config.workflow, config.policy_names()).specs(1)}
    log = open_log("kafka", bootstrap=config.log.bootstrap, client_config=config.log.client_config())
    try:
        written = {topic: sum(log.end_offsets(topic).values()) for topic in sorted(names & set(log.list_topics()))}
    finally:
        log.close()
    holding = [topic for topic, records in written.items() if records]
    if holding:
        raise AstraFlowError(
            f"run {config.run!r} already has records on the Kafka cluster {config.log.bootstrap} "
            f"({', '.join(holding[:3])}{', ...' if len(holding) > 3 else ''}), and the run directory {run_dir} "
            "did not write them: on Kafka a run is its topics, and started from here it would resume that run "
            "without its checkpoints. Give this run another name (`run:` in the config), continue the other "
            "with its own --run-dir, or delete its topics first: "
            f"astraflow runs rm {config.run} --bootstrap {config.log.bootstrap}"
        )


def refuse_another_runs_directory(config: RunConfig, run_dir: Path) -> None:
    """Refuse to start a run in a directory where the launcher ran another one: of another ``run``
    name, or on the other log backend (read from the ``config.yaml`` it left, before this run writes
    its own). The trainer resumes from the directory's checkpoints, whose offsets name records of
    that run's log: the math example run on Kafka in the directory of an embedded run resumed "at
    version 5 from offsets {0: 2560}" of a samples topic with no such records, and reported the
    embedded run's versions as its own."""
    folder = RunDir(run_dir)
    if not (folder.metrics.exists() and folder.config.exists()):
        return
    try:
        before = yaml.safe_load(folder.config.read_text()) or {}
        name, backend = before.get("run"), (before.get("log") or {}).get("backend", "embedded")
    except (OSError, yaml.YAMLError, AttributeError):
        return  # not a config the launcher wrote: nothing to compare
    if (name, backend) != (config.run, config.log.backend):
        raise AstraFlowError(
            f"the run directory {run_dir} holds run {name!r} on the {backend} log, and this is run "
            f"{config.run!r} on the {config.log.backend} log: its trainer would resume from that run's "
            "checkpoints, whose offsets name records of the other log. Give this run its own --run-dir"
        )


def launch(config: RunConfig, run_dir: Path, dashboard: bool = True) -> dict:
    """Run the whole system until a stop condition; return the summary written to summary.json."""
    refuse_another_runs_directory(config, run_dir)
    refuse_another_runs_topics(config, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = RunDir(run_dir).config
    dump_config(config, config_path)
    started = time.monotonic()
    warm = subprocess.run(_argv("warmup", config_path, run_dir), check=False)
    if warm.returncode != 0:
        raise AstraFlowError(f"warm-up failed with exit code {warm.returncode}; see {RunDir(run_dir).logs}")
    warmup_seconds = time.monotonic() - started

    topics = RunTopics(config.run, config.workflow, config.policy_names())
    log = open_run_log(config, run_dir)
    topics.ensure(log, config.log.partitions, config.weights.chunk_bytes)
    if config.log.backend == "kafka" and config.log.security.role_credentials:  # as admin: each role's ACLs
        grants = grant_run({"bootstrap.servers": config.log.bootstrap, **config.log.client_config()}, topics)
        logger.info("granted %d ACLs to the component roles of run %s", grants, config.run)
    recorder = ComponentContext(config, run_dir, "launcher")
    monitor = RunMonitor(config, run_dir, log, topics, report=ForgeryReporter(recorder))
    record = RestartRecorder(recorder, lambda: monitor.version)
    shutil.rmtree(run_dir / "pids", ignore_errors=True)

    def start(name: str, command: str, *options: str) -> Child:
        return Child(name, _argv(command, config_path, run_dir, *options), run_dir, on_restart=record)

    children = [start(name, command, *options) for name, (command, *options) in plan(config)]
    bounds = capped(config.scaler, config.log.partitions) if config.scaler.enabled else None
    pool = ProducerPool(
        lambda name: start(name, "rollout", "--region", "local"),
        children,
        config.rollout.producers,
        bounds.min_producers if bounds else 1,
        bounds.max_producers if bounds else 64,
    )
    interrupted = False
    failure: str | None = None
    signal.signal(signal.SIGTERM, _interrupt)  # `kill RUN_PID` stops the run like Ctrl-C: children too
    try:
        monitor.follow(
            children,
            dashboard=dashboard,
            on_refresh=(lambda: pool.resize(monitor.producers.desired)) if bounds else pool.reap,
        )
    except KeyboardInterrupt:
        interrupted = True
        logger.info("interrupted; stopping the components")
    except CrashLoopError as exc:
        failure = str(exc)
        logger.error("stopping the run: %s", failure)
    finally:
        everyone = children + pool.retiring
        stop_children(everyone)
    monitor.drain()
    summary = monitor.summary(warmup_seconds=warmup_seconds, interrupted=interrupted)
    summary["producer_seconds"] = pool.producer_seconds()
    summary["restarts"] = {child.name: child.restarts for child in everyone if child.restarts}
    summary["final_models"] = export_final_models(config, run_dir)
    if failure:
        summary["failed"] = failure
    RunDir(run_dir).summary.write_text(json.dumps(summary, indent=2))

    write_report(RunDir(run_dir).metrics, RunDir(run_dir).report)
    recorder.close()
    log.close()
    if failure:
        raise AstraFlowError(f"the run failed: {failure}")
    return summary
