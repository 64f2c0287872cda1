"""``astraflow replay``: train a fresh base model from the trajectories another run logged.

Steps:

1. Open the source run read-only (``open_run``: its directory's ``config.yaml``, or its
   config; ``--source-backend`` / ``--source-bootstrap`` point it at another log) and check that
   it fits the replay config (``check_compatible``). Plan the span to copy (``plan_span``).
2. Resolve the replay config (``replay_config``: the pipeline without ``staleness``, see below),
   write it to ``run_dir/config.yaml``, create the run's topics (refusing a trajectories topic
   that already holds records) and run ``astraflow warmup`` for the base checkpoint, as
   ``astraflow run`` does.
3. Start trainer, evaluator and stream processor as child processes (no feeder, no rollout
   producers), and copy the span into ``{run}.trajectories.{policy}`` on a thread of this process
   (``ReplaySource``).
4. Follow the metrics topic (``ReplayMonitor``) until the copied data is used up: the copy
   finished, the stream processor's group has no lag (or its lag stopped moving, when the span
   cut a group in two), fewer than ``train.batch_samples`` samples are left for the trainer, and
   the evaluator has caught up with the last version. ``stop.*``, ``--max-minutes`` and Ctrl-C
   stop it earlier.
5. Stop the copy and the children, drain the metrics, export the newest checkpoint to
   ``final/<policy>`` as ``astraflow run`` does, write ``summary.json`` (with a ``replay`` section
   and ``final_models``), ``metrics.jsonl`` and ``report.png``.

Versions. A replayed token's version counts the *source* run's optimizer steps, not this run's:
the staleness filter would compare the two and drop groups depending on how far this trainer
had got when the stream processor reached them. ``replay_config`` therefore removes the
``staleness`` operator. The off-policy gap is corrected where it always is: the trainer's
decoupled PPO loss weights each token by ``min(π_θ / π_b, C)`` against the behaviour log-probs
the source producer recorded (``training/loss.py``). For the same reason ``stream.staleness``
and ``train.staleness_max`` of a replay run compare unrelated version counters.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from astraflow.analysis.report import write_report
from astraflow.config import RunConfig, dump_config, parse_config
from astraflow.config.pipeline import StalenessSpec
from astraflow.core.errors import AstraFlowError, ConfigError
from astraflow.core.rundir import RunDir
from astraflow.infra.launch.launcher import Child
from astraflow.infra.launch.monitor import RunMonitor
from astraflow.infra.launch.replay_source import ReplaySource, ReplaySpan, plan_span
from astraflow.log import Log
from astraflow.runtime.attach import AttachedRun
from astraflow.runtime.context import open_run_log
from astraflow.runtime.topics import RunTopics
from astraflow.training.export import export_final_models

logger = logging.getLogger(__name__)

IDLE_S = 60.0
"""With the copy finished, a stream lag that stood still this long (after the stream processor
committed something) is taken for groups the span cut in two, which never complete."""
SETTLE_S = 120.0
"""Longest wait, once the data is used up, for the evaluator to score the last version."""
COMPONENTS = ("train", "evaluate", "stream")


def parse_time_ms(text: str, option: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 time (local time when it names no zone)."""
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError as exc:
        raise ConfigError(f"{option}: {text!r} is not an ISO 8601 time, e.g. 2026-05-01T12:30:00") from exc


def check_compatible(config: RunConfig, run_dir: Path, source: AttachedRun) -> str:
    """The source topic to replay into ``config``'s run; ``ConfigError`` when the two do not fit."""
    topic = RunTopics(source.name, source.config.workflow, (config.policy,)).trajectories(config.policy)
    if topic not in source.log.list_topics():
        found = ", ".join(source.topics_of("trajectories")) or "none"
        raise ConfigError(f"policy: the source run has no topic {topic} (its trajectory topics: {found})")
    if config.run == source.name:
        raise ConfigError(
            f"run: the replay needs its own run name, not the source's {source.name!r} (e.g. {source.name}-replay)"
        )
    if run_dir.resolve() == source.run_dir.resolve():
        raise ConfigError(f"--run-dir {run_dir}: that is the source run's directory; replay into a new one")
    mismatches = {
        "model.path": (config.model.path, source.config.model.path, "the token ids are the source tokenizer's"),
        "task": (config.task, source.config.task, "the held-out split must be the one the source never trained on"),
        "rollout.temperature": (
            config.rollout.temperature,
            source.config.rollout.temperature,
            "the trainer's log-probs must use the temperature the behaviour log-probs were sampled at",
        ),
    }
    for field, (mine, theirs, why) in mismatches.items():
        if mine != theirs:
            raise ConfigError(f"{field}: must equal the source run's ({theirs!r}, here {mine!r}): {why}")
    return topic


def replay_config(config: RunConfig) -> RunConfig:
    """``config`` with the staleness operator removed from the stream pipeline (module docstring), and
    no check of trajectories against issued tasks (``stream.verify_tasks: off``): the copied
    trajectories' tasks are on the source run's tasks topic, not on this run's."""
    operators = config.stream.operators()
    kept = [spec for spec in operators if not isinstance(spec, StalenessSpec)]
    raw = config.model_dump(mode="json")
    raw["stream"] = {**raw["stream"], "verify_tasks": "off"}
    if len(kept) < len(operators):
        logger.warning("replay: no staleness operator: replayed token versions count the source run's steps")
        raw["stream"]["pipeline"] = [spec.model_dump(mode="json") for spec in kept]
        raw["stream"].pop("advantage", None)
        raw["stream"].pop("drop_zero_variance", None)
    return parse_config(raw, source="replay config")


class ReplayMonitor(RunMonitor):
    """A ``RunMonitor`` that also stops once the replayed data is used up (module docstring, step 4)."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        log: Log,
        topics: RunTopics,
        source: ReplaySource,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(config, run_dir, log, topics)
        self.source = source
        self.stop_reason = ""
        self._clock = clock
        self._left: tuple[int, int] | None = None
        self._still_since = clock()
        self._used_up_at: float | None = None

    def done(self) -> str | None:
        reason = super().done() or self._replay_done()
        if reason:
            self.stop_reason = reason
        return reason

    def left(self) -> tuple[int, int]:
        """Trajectories the stream processor has not committed, and samples the trainer has not."""
        policy, run = self.config.policy, self.config.run
        groups = self.log.group_offsets()
        lags = []
        for group, topic in (
            (f"{run}.stream.{policy}", self.topics.trajectories(policy)),
            (f"{run}.train.{policy}", self.topics.samples(policy)),
        ):
            committed = {tp.partition: offset for tp, offset in groups.get(group, {}).items() if tp.topic == topic}
            lags.append(sum(end - committed.get(p, 0) for p, end in self.log.end_offsets(topic).items()))
        return lags[0], lags[1]

    def _replay_done(self) -> str | None:
        if self.source.error is not None:
            return f"replay source failed: {self.source.error}"
        if not self.source.finished.is_set():
            return None
        now = self._clock()
        if self._used_up_at is None:
            left = self.left()
            if left != self._left:
                self._left, self._still_since = left, now
            stream_left, train_left = left
            stream_idle = (
                stream_left < self.source.copied and now - self._still_since >= IDLE_S
            )  # started, then stood still
            if train_left >= self.config.train.batch_samples or (stream_left and not stream_idle):
                return None
            self._used_up_at = now
            return None  # the last version's metrics may still be in flight: look again next refresh
        last_scored = max(self.accuracy, default=-1)
        if self.version - last_scored < self.config.eval.every_versions or now - self._used_up_at > SETTLE_S:
            stream_left, train_left = self._left or (0, 0)
            return (
                f"replayed data used up: {self.source.copied} trajectories copied, {stream_left} left in cut groups, "
                f"{train_left} samples short of a batch"
            )
        return None


def _argv(component: str, config_path: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "astraflow.cli", component, str(config_path), "--run-dir", str(run_dir)]


def replay(config: RunConfig, source: AttachedRun, run_dir: Path, span_options: dict, dashboard: bool = True) -> dict:
    """Replay ``source``'s trajectories into a new run of ``config``; return the summary written to summary.json.

    ``span_options`` are ``plan_span``'s keywords (``from_offset``, ``since_ms``, ``until_ms``).
    """
    source_topic = check_compatible(config, run_dir, source)
    config = replay_config(config)
    span = plan_span(source.log, source_topic, **span_options)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = RunDir(run_dir).config
    dump_config(config, config_path)
    topics = RunTopics(config.run, config.workflow, (config.policy,))
    log = open_run_log(config, run_dir)
    topics.ensure(log, config.log.partitions, config.weights.chunk_bytes)
    target = topics.trajectories(config.policy)
    held = sum(log.end_offsets(target).values())
    if held:
        log.close()
        raise ConfigError(
            f"{target} already holds {held} records; replay into a fresh run (another run name or --run-dir)"
        )
    started = time.monotonic()
    warm = subprocess.run(_argv("warmup", config_path, run_dir), check=False)
    if warm.returncode != 0:
        log.close()
        raise AstraFlowError(f"warm-up failed with exit code {warm.returncode}; see {RunDir(run_dir).logs}")
    warmup_seconds = time.monotonic() - started

    copier = ReplaySource(source.log, span, log, target)
    monitor = ReplayMonitor(config, run_dir, log, topics, copier)
    children = [Child(name, _argv(name, config_path, run_dir), run_dir) for name in COMPONENTS]
    stop_copy = threading.Event()
    thread = copier.start(stop_copy)
    logger.info("replaying %d records of %s into %s", span.total, source_topic, target)
    interrupted = False
    try:
        monitor.follow(children, dashboard=dashboard, on_refresh=_copy_note(copier, span))
    except KeyboardInterrupt:
        interrupted = True
        logger.info("interrupted; stopping the replay")
    finally:
        stop_copy.set()
        thread.join(timeout=30)
        for child in children:
            child.terminate()
        deadline = time.monotonic() + 30
        for child in children:
            child.wait(deadline)
    monitor.drain()
    summary = monitor.summary(warmup_seconds=warmup_seconds, interrupted=interrupted)
    summary["replay"] = _replay_section(config, source, span, copier, monitor.stop_reason)
    summary["final_models"] = export_final_models(config, run_dir)
    RunDir(run_dir).summary.write_text(json.dumps(summary, indent=2))

    write_report(RunDir(run_dir).metrics, RunDir(run_dir).report)
    log.close()
    return summary


def _copy_note(copier: ReplaySource, span: ReplaySpan):
    """``on_refresh`` for the monitor: one dashboard note when the copy has finished."""
    noted = False

    def note() -> str | None:
        nonlocal noted
        if copier.finished.is_set() and not noted:
            noted = True
            return f"replay source: copied {copier.copied} of {span.total} records of {span.topic}"
        return None

    return note


def _replay_section(
    config: RunConfig, source: AttachedRun, span: ReplaySpan, copier: ReplaySource, reason: str
) -> dict:
    return {
        "source_run": source.name,
        "source_backend": source.config.log.backend,
        "source_topic": span.topic,
        "span_start": span.start,
        "span_end": span.end,
        "planned": span.total,
        "copied": copier.copied,
        "copy_finished": copier.finished.is_set(),
        "pipeline": [spec.op for spec in config.stream.operators()],
        "stop_reason": reason,
    }
