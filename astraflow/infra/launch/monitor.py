"""The run monitor: follows every role's ``{run}.metrics.{role}``, keeps ``metrics.jsonl`` and the
TensorBoard event files (``RUN_DIR/tensorboard``, ``analysis/tensorboard.py``; skipped with a note
when tensorboardX is not installed), shows the run's progress: the live dashboard on a terminal,
otherwise a plain line every 10 s (``progress.py``).

It is an analysis consumer like any other (no group, nothing committed), so it never slows the
components. Records/s per topic comes from the topics' end offsets, sampled each refresh.

It believes a metric only from the role allowed to write it, and a dead letter only from a role
that reads the record it names (``runtime/control.py``): anything else is a forgery, counted in
``summary.json`` (``forgeries``), reported through ``report`` (the launcher dead-letters it, naming
the forger's topic and offset) and never acted on, so a component cannot end the run, fake its
figures or resize its producer pool by writing what is not its to write.

With several policies, accuracy and version are kept per policy (the ``policy`` label of
``eval.accuracy`` and ``train.version``); the run's headline accuracy and ``stop`` conditions
follow the first policy declared, ``stop.max_versions`` the slowest trainer, and
``stop.target_gain`` waits for every policy. The system
evaluator's ``eval.system.*`` metrics are kept per version pair (their ``versions`` label).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from astraflow.analysis.producer_stats import ProducerTally
from astraflow.analysis.tensorboard import TensorBoardWriter
from astraflow.config import RunConfig
from astraflow.core.errors import AstraFlowError, LogError, MissingDependencyError
from astraflow.core.metric_names import EVAL_ACCURACY, EVAL_SYSTEM_PREFIX, STREAM_GROUP_REWARD, TRAIN_VERSION
from astraflow.core.rundir import RunDir
from astraflow.infra.launch.dashboard import Dashboard
from astraflow.infra.launch.progress import ProgressLines
from astraflow.log import Log, Message, TopicPartition
from astraflow.runtime.control import forged_letter, forged_metric
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, Metric

REFRESH_S = 1.0
logger = logging.getLogger(__name__)


def gain_over_base(accuracy: dict[int, float], after: int = 0) -> float:
    """The mean of the last two held-out evaluations of versions after ``after``, minus the base
    (version 0's); one evaluation of a few hundred prompts is too noisy to stop on. ``-inf`` until
    the base and both evaluations exist."""
    late = [accuracy[version] for version in sorted(accuracy) if version > after][-2:]
    if 0 not in accuracy or len(late) < 2:
        return float("-inf")
    return sum(late) / 2 - accuracy[0]


class RunMonitor:
    """Collects metrics of one run and decides when the run is done."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        log: Log,
        topics: RunTopics,
        report: Callable[[Message, str], None] | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.topics = topics
        self.codec = Codec()
        self.started = time.monotonic()
        self.started_ms = int(time.time() * 1000)
        self.out = RunDir(run_dir).metrics.open("a")
        self.consumer = log.consumer(group_id=None)
        self.letter_topics = set(topics.deadletter_topics())
        self.consumer.assign([TopicPartition(topic, 0) for topic in [*topics.metrics_topics(), *self.letter_topics]])
        self.consumer.seek_to_beginning()
        self.report = report
        self.forgeries: Counter[str] = Counter()
        """Metrics and dead letters read from a role not allowed to write them, by kind; never acted on."""
        self.policies = config.policy_names()
        self.policy_accuracy: dict[str, dict[int, float]] = {policy: {} for policy in self.policies}
        self.accuracy = self.policy_accuracy[self.policies[0]]
        self.policy_versions: dict[str, int] = {policy: 0 for policy in self.policies}
        self.policy_latest: dict[str, dict[str, float]] = {policy: {} for policy in self.policies}
        """Per policy, the newest value of each metric name (a metric with no ``policy`` label: the first policy's)."""
        self.system: dict[str, dict[str, float]] = {}
        self.latest: dict[str, float] = {}
        self.rewards: deque[float] = deque(maxlen=200)
        self.version = 0
        self.notes: deque[str] = deque(maxlen=4)
        self.rates: dict[str, float] = {}
        self.producers = ProducerTally()
        self.ends: tuple[float, dict[str, int]] | None = None
        """(``time.monotonic()``, end offset of each topic) of the newest sample, for the rates."""
        self.tensorboard: TensorBoardWriter | None = None
        try:
            self.tensorboard = TensorBoardWriter(RunDir(run_dir).tensorboard, self.policies)
        except MissingDependencyError as exc:
            logger.warning("%s", exc)
            self.notes.append(f"no TensorBoard events: {exc}")

    def _consume(self, timeout: float) -> None:
        for message in self.consumer.poll(max_records=5000, timeout=timeout):
            if message.topic in self.letter_topics:
                self._check_letter(message)
                continue
            try:
                metric = self.codec.decode(message.value, expect=Metric)
            except AstraFlowError as exc:
                self.notes.append(f"bad metric record at offset {message.offset}: {exc}")
                continue
            forged = forged_metric(message.topic, metric)
            if forged is not None:
                self._forgery("metrics", message, forged)
                continue
            wall = (metric.created_ms - self.started_ms) / 1000
            self.out.write(
                json.dumps(
                    {
                        "component": metric.component,
                        "name": metric.name,
                        "value": metric.value,
                        "step": metric.step,
                        "wall_s": round(wall, 3),
                        "labels": metric.labels,
                    }
                )
                + "\n"
            )
            if self.tensorboard is not None:
                self.tensorboard.add(metric)
            self.latest[metric.name] = metric.value
            self.producers.observe(metric)
            policy = metric.labels.get("policy", self.policies[0])
            if policy in self.policy_latest:
                self.policy_latest[policy][metric.name] = metric.value
            if metric.name == EVAL_ACCURACY and policy in self.policy_accuracy:
                self.policy_accuracy[policy][metric.step] = metric.value
            elif metric.name == TRAIN_VERSION and policy in self.policy_versions:
                self.policy_versions[policy] = max(self.policy_versions[policy], int(metric.value))
                self.version = min(self.policy_versions.values())
            elif metric.name.startswith(EVAL_SYSTEM_PREFIX):
                figure = metric.name.removeprefix(EVAL_SYSTEM_PREFIX)
                self.system.setdefault(metric.labels.get("versions", str(metric.step)), {})[figure] = metric.value
            elif metric.name == STREAM_GROUP_REWARD:
                self.rewards.append(metric.value)
        self.out.flush()

    def _check_letter(self, message: Message) -> None:
        try:
            letter = self.codec.decode(message.value, expect=DeadLetter)
        except AstraFlowError as exc:
            self._forgery("dead_letters", message, f"undecodable dead letter on {message.topic}: {exc}")
            return
        forged = forged_letter(self.config.run, message.topic, letter)
        if forged is not None:
            self._forgery("dead_letters", message, forged)

    def _forgery(self, kind: str, message: Message, reason: str) -> None:
        self.forgeries[kind] += 1
        self.notes.append(f"forged record ignored: {reason}")
        where = f"{message.topic}[{message.partition}]@{message.offset}"
        logger.warning("forged record at %s ignored: %s", where, reason)
        if self.report is not None:
            self.report(message, reason)

    def _sample_rates(self) -> None:
        names = [self.topics.tasks()] + [
            topic(policy) for policy in self.policies for topic in (self.topics.trajectories, self.topics.samples)
        ]
        ends = {name: sum(self.log.end_offsets(name).values()) for name in names}
        now = time.monotonic()
        if self.ends is not None:
            then, previous = self.ends
            self.rates = {name: (ends[name] - previous[name]) / max(now - then, 1e-6) for name in names}
        self.ends = (now, ends)

    def done(self) -> str | None:
        """Why the run should stop now, or ``None``."""
        stop = self.config.stop
        if time.monotonic() - self.started > stop.max_minutes * 60:
            return f"time budget of {stop.max_minutes} min reached"
        if (
            stop.target_accuracy is not None
            and self.accuracy
            and self.accuracy[max(self.accuracy)] >= stop.target_accuracy
        ):
            return f"held-out accuracy reached {stop.target_accuracy}"
        if stop.max_versions is not None and self.version >= stop.max_versions:
            return f"{stop.max_versions} versions trained"
        if stop.target_gain is not None and all(self.gain(policy) >= stop.target_gain for policy in self.policies):
            return f"every policy's held-out accuracy gained {stop.target_gain} over its base"
        return None

    def gain(self, policy: str) -> float:
        """``policy``'s ``gain_over_base``."""
        return gain_over_base(self.policy_accuracy[policy])

    def follow(self, children: list, dashboard: bool, on_refresh: Callable[[], str | None] | None = None) -> None:
        """Refresh until ``done``; ``on_refresh`` runs after each refresh's checks (a note, or ``None``).

        With ``dashboard`` and stdout a terminal the live dashboard shows the run; otherwise a
        progress line is printed every 10 s, so a run in a pipe or a log file shows it too.
        """
        console = Console()
        view = Dashboard(self, console) if dashboard and console.is_terminal else ProgressLines(self, console)
        with view:
            while True:
                self._consume(timeout=REFRESH_S)
                try:
                    self._sample_rates()
                except LogError as exc:  # a broker restart: the children still need supervising
                    self.notes.append(f"log unreachable: {exc}")
                for child in children:
                    note = child.check()
                    if note:
                        self.notes.append(note)
                note = on_refresh() if on_refresh is not None else None
                if note:
                    self.notes.append(note)
                view.refresh(children)
                reason = self.done()
                if reason:
                    self.notes.append(f"stopping: {reason}")
                    view.refresh(children)
                    return

    def drain(self) -> None:
        """Read the metrics the components flushed while stopping."""
        deadline = time.monotonic() + 10
        self._consume(timeout=1.0)
        while any(self.consumer.lag().values()) and time.monotonic() < deadline:
            self._consume(timeout=1.0)
        self.close()

    def close(self) -> None:
        """Close metrics.jsonl, the TensorBoard events and the metrics consumer."""
        self.out.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.consumer.close()

    def summary(self, warmup_seconds: float, interrupted: bool) -> dict:
        versions = sorted(self.accuracy)
        trajectories = sum(
            sum(self.log.end_offsets(self.topics.trajectories(policy)).values()) for policy in self.policies
        )
        summary = {
            "run": self.config.run,
            "backend": self.config.log.backend,
            "base_accuracy": self.accuracy.get(0, float("nan")),
            "final_accuracy": self.accuracy[versions[-1]] if versions else float("nan"),
            "best_accuracy": max(self.accuracy.values()) if versions else float("nan"),
            "accuracy_by_version": {str(v): self.accuracy[v] for v in versions},
            "versions": self.version,
            "trajectories": trajectories,
            "wall_seconds": time.monotonic() - self.started,
            "warmup_seconds": warmup_seconds,
            "interrupted": interrupted,
            "forgeries": dict(self.forgeries),
        }
        if self.config.policies:
            summary["policies"] = {policy: self._policy_summary(policy) for policy in self.policies}
        if self.system:
            pairs = list(self.system)
            summary["system_accuracy"] = {
                "base": self.system[pairs[0]],
                "final": self.system[pairs[-1]],
                "by_versions": self.system,
            }
        return summary

    def _policy_summary(self, policy: str) -> dict:
        accuracy = self.policy_accuracy[policy]
        versions = sorted(accuracy)
        return {
            "base_accuracy": accuracy.get(0, float("nan")),
            "final_accuracy": accuracy[versions[-1]] if versions else float("nan"),
            "best_accuracy": max(accuracy.values()) if versions else float("nan"),
            "accuracy_by_version": {str(v): accuracy[v] for v in versions},
            "versions": self.policy_versions[policy],
        }
