"""Offline sources: the runtime side of the ``offline`` mixer.

An ``offline`` operator in ``stream.pipeline`` names a trajectory topic - usually another run's,
on this log or on the log of the run directory given as ``source`` - whose groups make up a share
of the emitted samples (``mixing.OfflineMixer`` keeps the count). ``OfflineSource`` moves its
records, so operators stay free of I/O:

1. ``fill(fresh)``, called by the runtime before it emits ``fresh`` new samples, reads the topic
   until the mixer has what it will owe, or the topic has nothing more for now. Records that do
   not decode or validate are dead-lettered with the reason (a group with such a member is
   dropped) through the runtime's ``dead_letter``, so into its open transaction; completed
   groups go through the pipeline's group operators except ``staleness`` (their token versions
   count the source run's optimizer steps; the trainer's decoupled loss corrects the off-policy
   gap against the recorded behaviour log-probs, as in ``astraflow replay``). Drops count in
   ``stream.offline_dropped.<kind>``.
2. Used up: with ``loop`` the topic starts over (pass n+1; sample ids carry ``#offline<n>`` so
   the trainer does not drop a new pass as repeats), otherwise nothing more is mixed in.
3. ``state()``, which the native runtime journals in its changelog with every transaction
   (``offline␟{index}``), is the source's position as of that transaction: per partition the
   offset to read on from (below every group still half-read), the ids of the groups at or after
   it that are closed already (mixed, fed to the mixer, or dropped), the pass, and whether the
   topic is used up. The groups fed but not yet emitted are the mixer's own state
   (``OfflineMixer.state_dict``), restored by ``resolve``. A restarted processor is given the
   committed ``state`` and goes on exactly from there: no offline group is emitted twice or
   skipped, and the pass count goes on. The source reads with a consumer of no group, so the
   source run's log is only ever read.

The native runtime keeps its state per input partition (``streams.changelog``), offline sources
included: the processor makes one source per mixer for each input partition it is assigned, and
the source of input partition ``p`` of ``P`` mixes in the offline groups whose id hashes to ``p``
(``share``; crc32 of the id, modulo ``P``). So the shares are disjoint and cover the topic, however
the input partitions are spread over processor instances, and a partition taken over by another
instance goes on with its own share from its own position.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Callable

from astraflow.config import RunConfig
from astraflow.core.errors import AstraFlowError, ConfigError, error_reason
from astraflow.core.metric_names import STREAM_OFFLINE_GROUPS, STREAM_OFFLINE_USED_UP, stream_offline_dropped
from astraflow.log import Log, Message, TopicPartition
from astraflow.runtime.attach import open_run
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import Trajectory
from astraflow.schemas.validation import Limits, clipped, validate
from astraflow.streams.operators.base import Group, GroupBuffer, GroupOperator, run_pipeline
from astraflow.streams.operators.mixing import OfflineMixer
from astraflow.streams.runtimes.pending import read_trajectories

logger = logging.getLogger(__name__)

FETCH_WAIT_S = 5.0
"""Longest ``fill`` waits for records the topic holds but the client has not fetched yet (a Kafka
consumer's first fetch takes a moment); a fresh group mixed meanwhile earns no offline share."""
DeadLetterSink = Callable[[Message | None, str, BaseException | None], None]
"""Where a record that cannot be used goes: the runtime's dead letters, in its open transaction."""


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


def state_key(index: int) -> bytes:
    """The changelog key of the state of the offline source of the pipeline's ``index``-th offline mixer."""
    return f"offline\x1f{index}".encode()


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
        state: bytes | None = None,
        dead_letter: DeadLetterSink | None = None,
        share: tuple[int, int] = (0, 1),
    ) -> None:
        self.ctx = ctx
        self.index = index
        self.share = share
        """(input partition, input partitions): this source mixes in the groups whose id hashes to the first."""
        self._labels = {"policy": policy, "partition": str(share[0])}
        """Its metrics' labels: each input partition's source counts its own share."""
        self._dead_letter = dead_letter or ctx.dead_letter
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
        self.topic = mixer.topic
        self.consumer = log.consumer(group_id=None)
        self.partitions = [TopicPartition(self.topic, p) for p in range(log.describe_topic(self.topic).partitions)]
        self.consumer.assign(self.partitions)
        self.buffer = GroupBuffer()
        self.passes = 0
        self.exhausted = False
        self.fed = 0
        self.drops: Counter[str] = Counter()
        self._spans: dict[tuple[str, int], tuple[int, int]] = {}
        """(group id, partition) → (first offset, last offset) of the group's records read there in this pass."""
        self._closed: set[str] = set()
        """Groups closed before the state this source was restored from: their records are skipped."""
        if state is None:
            self.consumer.seek_to_beginning(self.partitions)
        else:
            self._restore(state)
        self.mixer.resolve(self._lookup)

    def fill(self, fresh_samples: int, version: int) -> None:
        """Read until the mixer holds what ``fresh_samples`` more fresh samples will earn."""
        deadline = time.monotonic() + FETCH_WAIT_S
        while not self.exhausted and self.mixer.demand(fresh_samples) > 0:
            messages = self.consumer.poll(max_records=256, timeout=0.2)
            if messages:
                for message in messages:
                    self._add(message, version)
            elif self._at_end():
                self._used_up(version)
            elif time.monotonic() > deadline:
                return  # records there but not fetched yet: the rest at the next emit

    def _add(self, message, version: int) -> None:
        key = message.key.decode("utf-8", "replace") if message.key else None  # the group id
        try:
            trajectory = self.ctx.codec.decode(message.value, expect=Trajectory, keep=True)
        except AstraFlowError as exc:
            trajectory, error = None, exc
        else:
            key = trajectory.group_id
        if not self._mine(key):
            return  # another input partition's share of the topic
        if key is not None:
            first = self._spans.get((key, message.partition), (message.offset, message.offset))[0]
            self._spans[(key, message.partition)] = (first, message.offset)
            if key in self._closed:
                return  # a record of a group closed before the state restored, read again
        if trajectory is None:
            self._dead_letter(message, f"undecodable offline trajectory: {error}", error)
            group = None if key is None else self.buffer.fail(key, f"{message.partition}@{message.offset}")
        else:
            problem = validate(trajectory, self.limits)
            if problem is not None:
                self._dead_letter(message, f"invalid offline trajectory {clipped(trajectory.trajectory_id)}: {problem}")
                group = self.buffer.fail(key, trajectory.trajectory_id, trajectory.group_size)
            else:
                group = self.buffer.add(trajectory, message.partition, message.offset)
        if group is not None:
            self._accept(group, version)

    def _mine(self, group_id: str | None) -> bool:
        """Whether this source's share holds the group (a record naming none goes to the first share)."""
        mine, shares = self.share
        if group_id is None:
            return mine == 0
        return zlib.crc32(group_id.encode()) % shares == mine

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
            self.ctx.metric(stream_offline_dropped(kind), self.drops[kind], version, **self._labels)
            return
        group.operators.append(f"offline:{self.mixer.topic}")
        self.mixer.feed(group)
        self.fed += 1
        self.ctx.metric(STREAM_OFFLINE_GROUPS, self.fed, version, **self._labels)

    def _at_end(self) -> bool:
        ends = self.log.end_offsets(self.topic)
        return all(self.consumer.position(tp) >= ends.get(tp.partition, 0) for tp in self.partitions)

    def _used_up(self, version: int) -> None:
        if not self.mixer.loop:
            logger.info("offline topic %s used up after %d groups; no more offline samples", self.mixer.topic, self.fed)
            self.exhausted = True
            self.ctx.metric(STREAM_OFFLINE_USED_UP, 1.0, version, **self._labels)
            return
        self.passes += 1
        self.buffer = GroupBuffer()  # a new pass completes the same group ids again
        self._spans, self._closed = {}, set()
        self.consumer.seek_to_beginning(self.partitions)
        logger.info("offline topic %s used up: pass %d starts over", self.mixer.topic, self.passes)

    @property
    def key(self) -> bytes:
        """The source's key in the runtime's changelog."""
        return state_key(self.index)

    def state(self) -> bytes:
        """The source's position as of now, for the runtime's changelog (step 3)."""
        pending = set(self.buffer.pending)
        nxt = {tp.partition: self.consumer.position(tp) for tp in self.partitions}
        for (gid, partition), (first, _) in self._spans.items():
            if gid in pending:
                nxt[partition] = min(nxt[partition], first)
        # a closed group with a record at or after the resume point would be read again: name it
        kept = {(gid, p): span for (gid, p), span in self._spans.items() if span[1] >= nxt[p]}
        gone = {gid for gid, _ in self._spans} - {gid for gid, _ in kept}
        self._spans, self._closed = kept, self._closed - gone
        closed = {gid for gid, _ in kept if gid not in pending} | self._closed
        state = {
            "next": {str(partition): offset for partition, offset in nxt.items()},
            "closed": sorted(closed),
            "passes": self.passes,
            "fed": self.fed,
            "exhausted": self.exhausted,
            "drops": dict(self.drops),
        }
        return json.dumps(state).encode()

    def _restore(self, state: bytes) -> None:
        saved = json.loads(state)
        self.passes, self.fed, self.exhausted = int(saved["passes"]), int(saved["fed"]), bool(saved["exhausted"])
        self._closed = set(saved["closed"])
        self.drops = Counter(saved["drops"])
        for tp in self.partitions:
            self.consumer.seek(tp, int(saved["next"].get(str(tp.partition), 0)))

    def _lookup(self, positions: list[tuple[int, int]]) -> list[Trajectory | None]:
        """The trajectories at these positions of the offline topic (for the mixer's restored groups)."""
        return read_trajectories(self.log, self.topic, self.ctx.codec, positions)

    def close(self) -> None:
        self.consumer.close()
        if self._source_log is not None:
            self._source_log.close()
