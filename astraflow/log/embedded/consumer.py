"""The reading side of the embedded log.

``subscribe`` joins the group and takes this member's share of the partitions at once, so a
``seek`` right after it applies to them. Positions live in memory. A partition without one
starts at the group's committed offset, or by ``auto_offset_reset`` (``earliest``: the oldest
retained record, ``latest``: the end) when the group has none or there is no group. A position
below the log start (records deleted by retention or compaction) reads on from the next record
that is still there.

``poll``, step by step:

1. in a group, sync the assignment (``groups`` step 4); a partition that was lost forgets its
   position, so it is not read again unless it comes back, from the committed offset; with a new
   generation every partition does;
2. read up to ``max_records`` records (and about ``FETCH_MAX_BYTES``, at least one) from the
   assigned partitions that have records past the position, starting one partition further on
   every poll so that none starves;
3. return them at once if there are any; otherwise wait for a writer's ring on the topics it reads
   (``embedded_doorbell``; the first time, register and read once more) or 5 ms (doubling up to
   20 ms), whichever comes first, and go back to 1 until ``timeout`` is spent.

``commit``, step by step:

1. take the given offsets, or the position of every assigned partition that has one;
2. in one transaction, a group member keeps only the partitions it still owns at the generation its
   assignment was computed at (``groups`` step 5: none, when the group changed since its last poll)
   and writes those to ``committed_offsets``;
3. when some were not owned, raise ``LogError`` naming them (the rest stay committed): their new
   owner reads those records again from the last commit, which is the at-least-once case.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import LogError
from astraflow.log.base import Consumer, Message, OffsetReset, TopicPartition
from astraflow.log.embedded import store
from astraflow.log.embedded.doorbell import Doorbell
from astraflow.log.embedded.groups import GroupMember

logger = logging.getLogger(__name__)

FETCH_MAX_BYTES = 64 * 1024 * 1024
POLL_WAIT_S = 0.005
"""An idle ``poll``'s first wait for a ring before it reads the file again; doubling up to ``POLL_WAIT_MAX_S``."""
POLL_WAIT_MAX_S = 0.02


class EmbeddedConsumer(Consumer):
    """A consumer of the embedded log; use it from one thread, like a Kafka consumer."""

    def __init__(
        self, path: Path, group_id: str | None, auto_offset_reset: OffsetReset, session_timeout_s: float
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise LogError(f"auto_offset_reset must be 'earliest' or 'latest', got {auto_offset_reset!r}")
        if session_timeout_s <= 0:
            raise LogError(f"session_timeout_s must be > 0, got {session_timeout_s}")
        self._store = store.Store(path)
        self._group_id = group_id
        self._reset = auto_offset_reset
        self._session_timeout_s = session_timeout_s
        self._member: GroupMember | None = None
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._turn = 0
        self._closed = False
        self._bell = Doorbell(path)

    @property
    def group_id(self) -> str | None:
        """The consumer group; ``None`` for a consumer that can only ``assign``."""
        return self._group_id

    def subscribe(self, topics: Sequence[str]) -> None:
        group_id = self._require_group("subscribe")
        if self._member is None:
            self._member = GroupMember(self._store.path, group_id, self._session_timeout_s)
        self._set_assignment([])
        self._member.join(self._store, topics)
        self._sync_group()

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._leave_group()
        self._set_assignment(list(dict.fromkeys(partitions)))

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        delay = POLL_WAIT_S
        while True:
            self._sync_group()
            messages = self._fetch(max_records)
            remaining = deadline - time.monotonic()
            if messages or remaining <= 0:
                return messages
            if self._bell.register({tp.topic for tp in self._assigned}):
                continue  # records appended before the registration rang no one: read once more first
            self._bell.wait(min(delay, remaining))
            delay = min(delay * 2, POLL_WAIT_MAX_S)

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        group_id = self._require_group("commit")
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self._assigned if tp in self._positions}
        if not offsets:
            return
        crash_point("embedded.commit_offsets", group_id)
        rejected = self._store.write(lambda conn: self.commit_in(conn, offsets))
        if rejected:
            names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in rejected)
            raise LogError(
                f"group {group_id!r}: commit of {names} rejected because the group changed since this member's"
                " last poll or they now belong to another member, who will read their records again; the other"
                " partitions were committed"
            )

    def commit_in(self, conn: sqlite3.Connection, offsets: dict[TopicPartition, int]) -> list[TopicPartition]:
        """Step 2 of ``commit`` in the caller's write transaction (the transactional producer
        commits offsets through it too): write the offsets of the partitions this member owns,
        return the others."""
        group_id = self._require_group("commit")
        owned = None if self._member is None else self._member.owned(conn)
        rejected = [] if owned is None else [tp for tp in offsets if tp not in owned]
        accepted = {(tp.topic, tp.partition): offset for tp, offset in offsets.items() if tp not in rejected}
        store.write_committed(conn, group_id, accepted)
        return rejected

    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        group_id = self._require_group("committed")
        return self._store.read(
            lambda conn: {tp: store.committed_offset(conn, group_id, tp.topic, tp.partition) for tp in partitions}
        )

    def position(self, partition: TopicPartition) -> int:
        self._require_assigned([partition])
        if partition not in self._positions:
            self._positions[partition] = self._store.read(lambda conn: self._start_position(conn, partition))
        return self._positions[partition]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._require_assigned([partition])
        self._positions[partition] = offset

    def seek_to_beginning(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        self._seek_each(partitions, lambda conn, tp: store.start_offset(conn, tp.topic, tp.partition))

    def seek_to_end(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        self._seek_each(partitions, _end_offset)

    def seek_to_timestamp(self, timestamp_ms: int, partitions: Sequence[TopicPartition] | None = None) -> None:
        self._seek_each(partitions, lambda conn, tp: store.offset_for_time(conn, tp.topic, tp.partition, timestamp_ms))

    def lag(self) -> dict[TopicPartition, int]:
        def read(conn: sqlite3.Connection) -> dict[TopicPartition, int]:
            for tp in self._assigned:
                if tp not in self._positions:
                    self._positions[tp] = self._start_position(conn, tp)
            return {tp: max(0, _end_offset(conn, tp) - self._positions[tp]) for tp in self._assigned}

        return self._store.read(read)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._leave_group()
        finally:
            self._bell.close()
            self._store.close()

    def _fetch(self, max_records: int) -> list[Message]:
        if not self._assigned or max_records < 1:
            return []
        start = self._turn % len(self._assigned)
        self._turn += 1
        order = self._assigned[start:] + self._assigned[:start]

        def read(conn: sqlite3.Connection) -> tuple[list[Message], dict[TopicPartition, int]]:
            positions = dict(self._positions)
            ends: dict[str, dict[int, int]] = {}
            out: list[Message] = []
            budget = FETCH_MAX_BYTES
            for tp in order:
                if len(out) >= max_records or budget <= 0:
                    break
                if tp.topic not in ends:
                    ends[tp.topic] = store.end_offsets(conn, tp.topic) or {}
                if tp not in positions:
                    positions[tp] = self._start_position(conn, tp)
                if positions[tp] >= ends[tp.topic].get(tp.partition, 0):
                    continue
                batch = store.read_records(conn, tp.topic, tp.partition, positions[tp], max_records - len(out), budget)
                if batch:
                    positions[tp] = batch[-1].offset + 1
                    budget -= sum(len(message.value) for message in batch)
                    out += batch
            return out, positions

        messages, self._positions = self._store.read(read)
        return messages

    def _start_position(self, conn: sqlite3.Connection, tp: TopicPartition) -> int:
        if self._group_id is not None:
            committed = store.committed_offset(conn, self._group_id, tp.topic, tp.partition)
            if committed is not None:
                return committed
        if self._reset == "earliest":
            return store.start_offset(conn, tp.topic, tp.partition)
        return _end_offset(conn, tp)

    def _sync_group(self) -> None:
        if self._member is None:
            return
        share = self._member.share_if_changed(self._store)
        if share is None:
            return
        gained, lost = set(share) - set(self._assigned), set(self._assigned) - set(share)
        if gained or lost:
            logger.info(
                "member %s of group %s now owns %d partitions (%d gained, %d lost)",
                self._member.member_id,
                self._member.group_id,
                len(share),
                len(gained),
                len(lost),
            )
        if self._member.new_generation:  # a kept partition may have moved and back: from the committed offset
            self._positions = {}
        self._set_assignment(share)

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        self._assigned = partitions
        self._positions = {tp: offset for tp, offset in self._positions.items() if tp in partitions}

    def _seek_each(
        self,
        partitions: Sequence[TopicPartition] | None,
        offset_of: Callable[[sqlite3.Connection, TopicPartition], int],
    ) -> None:
        targets = list(self._assigned if partitions is None else partitions)
        self._require_assigned(targets)
        found = self._store.read(lambda conn: {tp: offset_of(conn, tp) for tp in targets})
        self._positions.update(found)

    def _require_group(self, operation: str) -> str:
        if self._group_id is None:
            raise LogError(f"{operation} needs a consumer with a group_id")
        return self._group_id

    def _require_assigned(self, partitions: Sequence[TopicPartition]) -> None:
        missing = [tp for tp in partitions if tp not in self._assigned]
        if missing:
            raise LogError(f"partitions {missing} are not assigned to this consumer (assigned: {self._assigned})")

    def _leave_group(self) -> None:
        if self._member is not None:
            member, self._member = self._member, None
            member.leave(self._store)


def _end_offset(conn: sqlite3.Connection, tp: TopicPartition) -> int:
    return (store.end_offsets(conn, tp.topic) or {}).get(tp.partition, 0)
