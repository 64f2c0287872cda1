"""Offline sources: the runtime side of the ``offline`` mixer.

An ``offline`` operator in ``stream.pipeline`` names a trajectory topic - usually another run's,
on this log or on the log of the run directory given as ``source`` - whose groups make up a share
of the emitted samples (``mixing.OfflineMixer`` keeps the count). ``OfflineSource`` moves its
records, so operators stay free of I/O:

1. ``fill(fresh)``, called by the runtime before it emits ``fresh`` new samples, reads the topic
   until the mixer has what it will owe, or the topic has nothing more for now. Records that do
   not decode or validate are dead-lettered with the reason (a group with such a member is
   dropped); completed groups go through the pipeline's group operators except ``staleness``
   (their token versions count the source run's optimizer steps; the trainer's decoupled loss
   corrects the off-policy gap against the recorded behaviour log-probs, as in
   ``astraflow replay``). Drops count in ``stream.offline_dropped.<kind>``.
2. Used up: with ``loop`` the topic starts over (pass n+1; sample ids carry ``#offline<n>`` so
   the trainer does not drop a new pass as repeats), otherwise nothing more is mixed in. A
   processor restarted mid-pass counts passes from 0 again, so the trainer may drop the rest
   of that pass as repeats of ids it remembers (``audit`` counts them as copies dropped).
3. ``commit()``, after the runtime flushed its samples, commits the offsets below every group
   still buffered or fed but not emitted, in a consumer group of this run
   (``{run}.stream.{policy}.offline<index>``): a restarted processor resumes where its
   emitted offline data ends. The source run's own consumer groups are never touched.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from pathlib import Path

from astraflow.attach import open_run
from astraflow.config import RunConfig
from astraflow.context import ComponentContext
from astraflow.errors import AstraFlowError, ConfigError, LogError, error_reason
from astraflow.log import Log, TopicPartition
from astraflow.metric_names import STREAM_OFFLINE_GROUPS, STREAM_OFFLINE_USED_UP, stream_offline_dropped
from astraflow.schemas.records import Trajectory
from astraflow.schemas.validation import Limits, validate
from astraflow.streams.mixing import OfflineMixer
from astraflow.streams.operators import Group, GroupBuffer, GroupOperator, run_pipeline

logger = logging.getLogger(__name__)

ASSIGN_TIMEOUT_S = 30.0
"""Longest wait at start for the offline consumer's partitions (a Kafka group join takes seconds);
until then the first fresh groups would find nothing to mix with and earn no offline share."""


def check_source(config: RunConfig, source: RunConfig, where: str) -> None:
    """``ConfigError`` unless the source run's token ids and log-probs mean what this run's do."""
    mismatches = {
        "model.path": (config.model.path, source.model.path, "the token ids are the source tokenizer's"),
        "rollout.temperature": (
            config.rollout.temperature,
            source.rollout.temperature,
            "the behaviour log-probs were sampled at the source's temperature",
        ),
    }
    for field, (mine, theirs, why) in mismatches.items():
        if mine != theirs:
            raise ConfigError(
                f"stream.pipeline offline source {where}: {field} must equal the source run's "
                f"({theirs!r}, here {mine!r}): {why}"
            )


class OfflineSource:
    """Feeds one ``OfflineMixer`` from its topic, for one policy's stream processor."""

    def __init__(
        self,
        ctx: ComponentContext,
        policy: str,
        mixer: OfflineMixer,
        operators: list[GroupOperator],
        index: int,
        limits: Limits = Limits(),
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.mixer = mixer
        self.operators = [operator for operator in operators if operator.name != "staleness"]
        self.limits = dataclasses.replace(limits, group_size=None)  # another run's groups may have another size
        self._source_log: Log | None = None
        log = ctx.log
        if mixer.source is not None:
            source = open_run(Path(mixer.source))
            self._source_log = log = source.log
            check_source(ctx.config, source.config, mixer.source)
        if mixer.topic not in log.list_topics():
            where = mixer.source or "this run's log"
            raise ConfigError(f"stream.pipeline: offline topic {mixer.topic!r} does not exist in {where}")
        self.log = log
        self.consumer = log.consumer(group_id=f"{ctx.config.run}.stream.{policy}.offline{index}")
        self.consumer.subscribe([mixer.topic])
        self.buffer = GroupBuffer()
        self.passes = 0
        self.exhausted = False
        self.fed = 0
        self.drops: Counter[str] = Counter()
        self._first: dict[str, dict[int, int]] = {}  # group id → partition → its first record's offset
        deadline = time.monotonic() + ASSIGN_TIMEOUT_S
        while not self.consumer.assignment() and time.monotonic() < deadline:  # joining the group
            for message in self.consumer.poll(max_records=256, timeout=0.5):
                self._add(message, 0)

    def fill(self, fresh_samples: int, version: int) -> None:
        """Read until the mixer holds what ``fresh_samples`` more fresh samples will earn."""
        while not self.exhausted and self.mixer.demand(fresh_samples) > 0:
            messages = self.consumer.poll(max_records=256, timeout=0.2)
            if messages:
                for message in messages:
                    self._add(message, version)
            elif self._at_end():
                self._used_up(version)
            else:
                return  # the topic is behind or still being assigned: try again at the next emit

    def _add(self, message, version: int) -> None:
        key = message.key.decode("utf-8", "replace") if message.key else None  # the group id
        try:
            trajectory = self.ctx.codec.decode(message.value, expect=Trajectory, keep=True)
        except AstraFlowError as exc:
            self.ctx.dead_letter(message, f"undecodable offline trajectory: {exc}", exc)
            group = None if key is None else self.buffer.fail(key, f"{message.partition}@{message.offset}")
        else:
            key = trajectory.group_id
            problem = validate(trajectory, self.limits)
            if problem is not None:
                self.ctx.dead_letter(message, f"invalid offline trajectory {trajectory.trajectory_id}: {problem}")
                group = self.buffer.fail(key, trajectory.trajectory_id, trajectory.group_size)
            else:
                group = self.buffer.add(trajectory, message.partition, message.offset)
        if key is not None:
            self._first.setdefault(key, {}).setdefault(message.partition, message.offset)
        if group is not None:
            self._accept(group, version)

    def _accept(self, group: Group, version: int) -> None:
        group.origin = f"#offline{self.passes}"
        try:
            reason = (
                f"incomplete: {len(group.failed)} member(s) dead-lettered"
                if group.failed
                else run_pipeline(self.operators, group, version)
            )
        except Exception as exc:  # an operator that raises drops this group, never the processor
            logger.exception("stream operator failed on offline group %s", group.group_id)
            reason = error_reason(exc)
        if reason is not None:
            kind = reason.split(":", 1)[0]
            self.drops[kind] += 1
            self.ctx.metric(stream_offline_dropped(kind), self.drops[kind], version, policy=self.policy)
            return
        group.operators.append(f"offline:{self.mixer.topic}")
        self.mixer.feed(group)
        self.fed += 1
        self.ctx.metric(STREAM_OFFLINE_GROUPS, self.fed, version, policy=self.policy)

    def _at_end(self) -> bool:
        assignment = [tp for tp in self.consumer.assignment() if tp.topic == self.mixer.topic]
        if not assignment:
            return False
        ends = self.log.end_offsets(self.mixer.topic)
        return all(self.consumer.position(tp) >= ends.get(tp.partition, 0) for tp in assignment)

    def _used_up(self, version: int) -> None:
        if not self.mixer.loop:
            logger.info("offline topic %s used up after %d groups; no more offline samples", self.mixer.topic, self.fed)
            self.exhausted = True
            self.ctx.metric(STREAM_OFFLINE_USED_UP, 1.0, version, policy=self.policy)
            return
        self.passes += 1
        self.buffer = GroupBuffer()  # a new pass completes the same group ids again
        self.consumer.seek_to_beginning(self.consumer.assignment())
        logger.info("offline topic %s used up: pass %d starts over", self.mixer.topic, self.passes)

    def commit(self) -> None:
        """Commit below every offline group not emitted yet (buffered, or fed and still pending)."""
        pending = {group.group_id for group in self.mixer.pending} | set(self.buffer.pending)
        self._first = {gid: first for gid, first in self._first.items() if gid in pending}
        safe = {
            tp.partition: self.consumer.position(tp)
            for tp in self.consumer.assignment()
            if tp.topic == self.mixer.topic
        }
        for first in self._first.values():
            for partition, offset in first.items():
                if partition in safe:
                    safe[partition] = min(safe[partition], offset)
        try:
            self.consumer.commit({TopicPartition(self.mixer.topic, p): offset for p, offset in safe.items()})
        except LogError as exc:
            logger.warning("offline commit rejected (re-read after a rebalance): %s", exc)

    def close(self) -> None:
        self.consumer.close()
        if self._source_log is not None:
            self._source_log.close()
