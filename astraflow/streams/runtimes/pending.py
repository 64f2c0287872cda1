"""Half-filled groups outside a processor's memory: both runtimes keep them as pointers to records.

A half-filled group's members are records of the trajectories topic, which keeps them anyway
(forever, unless a retention is set on it). So what a runtime journals for them - the faust
runtime in its table (``faust_table``), the native runtime in its changelog (``changelog``) - is
where each member's record is, never its bytes: copying every trajectory into a changelog would
double what the processor and the log write. A restarted processor reads those records again
(``read_records``); one that retention deleted meanwhile makes its group incomplete, like a
dead-lettered member.

The native runtime's journal of one input partition is a ``snapshot`` of that partition's
``GroupBuffer``, rewritten whole whenever it changes: the Log API has no deletes (a record's
value is bytes, never a tombstone), so an entry per member, as the faust table keeps, would stay
in the changelog for ever once its group completed. A snapshot is JSON: one entry per half-filled
group, in arrival order, ``[group id, first member's record timestamp (ms), [[trajectory id,
offset], ...], [[dead-lettered member, group size it announced (0: unknown)], ...]]``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterator

from astraflow.log import Log, Message, TopicPartition
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Trajectory
from astraflow.streams.operators.base import Group, GroupBuffer

logger = logging.getLogger(__name__)


def snapshot(buffer: GroupBuffer) -> bytes:
    """The half-filled groups of ``buffer`` (one input partition's), as journaled (module docstring)."""
    groups = [
        [
            gid,
            started,
            [[tid, offset] for tid, (_, _, offset) in buffer.pending.get(gid, {}).items()],
            [[member, size] for member, size in buffer.failed.get(gid, {}).items()],
        ]
        for gid, started in buffer.started.items()
    ]
    return json.dumps(groups).encode()


def snapshot_offsets(state: bytes) -> list[int]:
    """The offsets of the records the trajectory members of a ``snapshot`` point at."""
    return [offset for _, _, members, _ in json.loads(state) for _, offset in members]


def restore(
    state: bytes, buffer: GroupBuffer, partition: int, records: dict[int, Message], codec: Codec
) -> list[Group]:
    """Put the half-filled groups of ``state`` back into ``buffer``, from the records their members
    point at (``read_records`` of ``snapshot_offsets``). Returns the groups that this completes:
    none, unless records are gone (their members count as dead-lettered)."""
    completed = []
    for gid, started, members, failed in json.loads(state):
        arrivals: list[Group | None] = []
        for tid, offset in members:
            record = records.get(offset)
            if record is None:
                logger.warning(
                    "record %d@%d of group %s is gone from the input (retention?): the group is incomplete",
                    partition,
                    offset,
                    gid,
                )
                arrivals.append(buffer.fail(gid, tid, 0, started))
            else:
                trajectory = codec.decode(record.value, expect=Trajectory, keep=True)
                arrivals.append(buffer.add(trajectory, partition, offset, started))
        arrivals += [buffer.fail(gid, member, size, started) for member, size in failed]
        completed += [group for group in arrivals if group is not None]
    return completed


def read_records(log: Log, topic: str, partition: int, offsets: list[int]) -> dict[int, Message]:
    """The records at ``offsets`` of one partition (those still there), read in one pass."""
    if not offsets:
        return {}
    wanted = set(offsets)
    return {m.offset: m for m in read_range(log, topic, partition, min(wanted), max(wanted) + 1) if m.offset in wanted}


def read_trajectories(log: Log, topic: str, codec: Codec, positions: list[tuple[int, int]]) -> list[Trajectory | None]:
    """The trajectories at these (partition, offset) positions of ``topic``, in their order; ``None``
    where retention deleted the record (an ``operators.TrajectoryLookup`` over one topic)."""
    wanted: dict[int, list[int]] = defaultdict(list)
    for partition, offset in positions:
        wanted[partition].append(offset)
    records = {p: read_records(log, topic, p, offsets) for p, offsets in wanted.items()}
    found = [records[partition].get(offset) for partition, offset in positions]
    return [None if r is None else codec.decode(r.value, expect=Trajectory, keep=True) for r in found]


def read_range(log: Log, topic: str, partition: int, start: int, end: int) -> Iterator[Message]:
    """The records of one partition from ``start`` up to ``end`` (exclusive) that are still there, in order."""
    consumer = log.consumer(group_id=None)
    try:
        yield from consumer.read_range(TopicPartition(topic, partition), start, end)
    finally:
        consumer.close()


def start_offset(log: Log, group: str, topic: str, partition: int) -> int:
    """Where ``group`` starts reading a partition it is assigned: its committed offset, else the first record's."""
    tp = TopicPartition(topic, partition)
    consumer = log.consumer(group_id=group, auto_offset_reset="earliest")
    try:
        consumer.assign([tp])
        return consumer.position(tp)
    finally:
        consumer.close()
