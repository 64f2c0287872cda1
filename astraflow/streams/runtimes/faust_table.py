"""Half-filled groups of the faust runtime, kept in a changelog-backed faust table.

The faust runtime collects groups in one ``GroupBuffer`` per input partition, the same class
the native runtime uses, so a group completes, fails or drops a duplicate the same way on both.
As the native runtime's changelog (``streams.changelog``) does for it, this table keeps the
half-filled groups for the faust runtime: the changes records make to a buffer are written to the
table's changelog topic in the same Kafka transaction as the records' input offsets, and a buffer
is rebuilt from the table when its partition is (re)assigned - after faust restored the table
from the changelog. So the offset of a record can be committed while its group is still half full.

The changes are written once per transaction, not per record: ``journal`` applies each record's
change to the store at once and keeps it as unsent, and ``flush`` - called just before each
commit, inside the transaction it commits - writes the net change since the last one. A group
whose members all arrive between two commits (the usual case: a producer writes a group's
members together) never reaches the changelog; an entry written before is deleted by a tombstone.

Layout: one entry per member, keyed ``{partition}␟{kind}␟{group_id}␟{member}`` (``␟`` is the
ASCII unit separator, which ids never contain), so a partition's entries are found by prefix:

- kind ``m``: a trajectory; the value is the offset of its record in the input partition;
- kind ``f``: a dead-lettered member (trajectory id, or partition@offset for bytes that did not
  decode); the value is the group size it announced (0: unknown);
- kind ``o``: the ``state_dict`` of the stateful operator at ``{index}`` (in place of the group id)
  of the partition's pipeline, ``{name}`` in place of the member: reward statistics, the
  REINFORCE++ window, a replay buffer with its credit and random generator, an ordering's held
  groups. Written by ``put_state`` at each commit when it changed, never deleted, and loaded when
  the partition is (re)assigned (``operator_state``), as the native runtime does with its
  changelog's ``operator␟{index}␟{name}`` keys.

A member entry points at its record instead of holding its bytes (``streams.pending`` says why),
and a buffer is rebuilt by reading those records again (``pending.read_records``); one that
retention deleted meanwhile makes its group incomplete, like a dead-lettered member.

``journal`` turns one record's effect on a buffer into table changes by comparing the group's
entries before and after: the arriving member is added, a completed group's entries are deleted.
The ids of completed groups that ``GroupBuffer`` remembers (to drop late duplicates) are not in
the table: after a restart, a late duplicate of a group emitted before it starts a new group
that never completes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping

from astraflow.log import Message
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Trajectory
from astraflow.streams.operators.base import GroupBuffer

logger = logging.getLogger(__name__)

SEPARATOR = b"\x1f"
MEMBER, FAILED, OPERATOR = b"m", b"f", b"o"

ChangelogWrite = Callable[[bytes, bytes | None, int], None]
"""Writes one changelog record: key, value (``None``: delete), partition."""


def entry_key(partition: int, kind: bytes, group_id: str, member: str) -> bytes:
    return SEPARATOR.join([str(partition).encode(), kind, group_id.encode(), member.encode()])


class PendingTable:
    """The table's contents (``data``: faust's store, restored from the changelog) and its writes."""

    def __init__(self, data: MutableMapping[bytes, bytes], write: ChangelogWrite) -> None:
        self.data = data
        self.write = write
        self.unsent: dict[int, dict[bytes, bytes | None]] = {}
        """Per partition, the changes not written to the changelog yet: key → value (``None``: delete)."""
        self.written: set[bytes] = set()
        """Keys whose entry is in the changelog (restored from it, or written by ``flush``), so
        that deleting them needs a tombstone."""

    def entries(self, buffer: GroupBuffer, partition: int, group_id: str | None) -> set[bytes]:
        """The keys that ``group_id``'s members in ``buffer`` have in the table."""
        if group_id is None:
            return set()
        keys = {entry_key(partition, MEMBER, group_id, member) for member in buffer.pending.get(group_id, {})}
        return keys | {entry_key(partition, FAILED, group_id, member) for member in buffer.failed.get(group_id, {})}

    def journal(self, before: set[bytes], after: set[bytes], partition: int, offset: int, group_size: int) -> None:
        """Apply what changed between two ``entries`` of one group around one arriving record,
        and keep it for the next ``flush``.

        ``offset`` is the arriving record's (stored for a trajectory) and ``group_size`` the size
        it announced (stored for a dead-lettered member): at most one entry is new.
        """
        unsent = self.unsent.setdefault(partition, {})
        for key in after - before:
            stored = str(offset if key.split(SEPARATOR, 2)[1] == MEMBER else group_size).encode()
            self.data[key] = stored
            unsent[key] = stored
        for key in before - after:
            self.data.pop(key, None)
            if key in self.written:
                unsent[key] = None
            else:  # added since the last flush: the changelog never needs to hear of it
                unsent.pop(key, None)

    def flush(self) -> int:
        """Write the changes kept since the last flush; returns how many were written."""
        count = 0
        for partition, changes in self.unsent.items():
            for key, value in changes.items():
                self.write(key, value, partition)
                if value is None:
                    self.written.discard(key)
                else:
                    self.written.add(key)
            count += len(changes)
        self.unsent.clear()
        return count

    def put_state(self, partition: int, index: int, name: str, state: bytes) -> None:
        """Keep the state of operator ``index`` (``name``) of ``partition``'s pipeline for the next
        ``flush``, unless the table holds it already."""
        key = entry_key(partition, OPERATOR, str(index), name)
        if self.data.get(key) != state:
            self.data[key] = state
            self.unsent.setdefault(partition, {})[key] = state

    def operator_state(self, partition: int, index: int, name: str) -> bytes | None:
        """The state ``put_state`` last kept for that operator (restored from the changelog after a restart)."""
        return self.data.get(entry_key(partition, OPERATOR, str(index), name))

    def forget(self, partition: int) -> None:
        """Drop what this table knows of ``partition`` beyond its store (the partition was revoked)."""
        self.unsent.pop(partition, None)
        prefix = str(partition).encode() + SEPARATOR
        self.written = {key for key in self.written if not key.startswith(prefix)}

    def members(self, partition: int) -> dict[tuple[str, str, str], int]:
        """The entries of ``partition``: (kind, group id, member) → offset (``m``) or group size (``f``)."""
        prefix = str(partition).encode() + SEPARATOR
        entries = {}
        for key, value in list(self.data.items()):
            if key.startswith(prefix):
                _, kind, group_id, member = key.decode().split(SEPARATOR.decode(), 3)
                if kind != OPERATOR.decode():
                    entries[(kind, group_id, member)] = int(value)
        return entries

    def offsets(self, partition: int) -> list[int]:
        """The input offsets the trajectory entries of ``partition`` point at (what ``read_records`` reads)."""
        return [number for (kind, _, _), number in self.members(partition).items() if kind == MEMBER.decode()]

    def restore(self, partition: int, records: dict[int, Message], codec: Codec) -> GroupBuffer:
        """A buffer holding the half-filled groups of ``partition`` that the table holds.

        ``records``: the input records its member entries point at, by offset (``read_records``).
        """
        buffer = GroupBuffer()
        entries = self.members(partition)
        self.written |= {entry_key(partition, kind.encode(), group_id, member) for kind, group_id, member in entries}
        for (kind, group_id, member), number in entries.items():
            if kind == FAILED.decode():
                buffer.fail(group_id, member, number)
            elif number in records:
                record = records[number]
                buffer.add(codec.decode(record.value, expect=Trajectory), partition, number, record.timestamp_ms)
            else:
                logger.warning(
                    "record %d@%d of group %s is gone from the input (retention?): the group is incomplete",
                    partition,
                    number,
                    group_id,
                )
                buffer.fail(group_id, member)
        return buffer
