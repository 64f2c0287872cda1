"""The native stream runtime's changelog: what a processor remembers, journaled with its commits.

Topic ``{run}.stream.{policy}.changelog`` (compacted, one partition), written only in the
processor's transactions, together with the outputs and input offsets of the poll that changed
it. Keys (``␟`` is the ASCII unit separator, which no id contains):

- ``pending␟{partition}``: the half-filled groups of one input partition (``pending.snapshot``);
- ``closed␟{slot}``: the groups one transaction closed (completed or given up), as JSON
  ``{"n": n, "closed": [[partition, group id, given up], ...]}``; the processor's n-th such record
  goes to slot ``n % CLOSED_SLOTS``. So the changelog holds the groups closed by the last
  ``CLOSED_SLOTS`` transactions that closed any - at least that many groups, usually many more -
  and a restarted processor still drops a late copy of them (dedup at stream entry, a defence:
  with exactly-once stages upstream, copies come only from mirrored or re-sent topics);
- ``operator␟{index}␟{name}``: the ``state_dict`` of the stateful operator at ``index`` of the
  pipeline (group operators, then mixers, then the ordering);
- ``clock``: the log's time, the newest record timestamp seen (ms), which group timeouts use.

A key is written in a transaction only when its value changed. The Log API cannot delete a key
(no tombstones), so the key space is bounded instead: input partitions + ``CLOSED_SLOTS`` +
stateful operators + 1, and compaction keeps the newest record of each. Kafka leaves its active
segment uncompacted, so there a restart may read more than the newest records.

``load`` reads the topic from its start to its end (``read_committed`` on Kafka). The processor
creates its transactional producer first: that fences its predecessor and ends the transaction
the predecessor left open, so what ``load`` reads is exactly what was committed.
"""

from __future__ import annotations

import json

from astraflow.log import Log, TransactionalProducer
from astraflow.streams.pending import read_range

CLOSED_SLOTS = 1024
"""Records of closed group ids kept: the ids closed by this many transactions."""
CLOCK = b"clock"
CLOSED = b"closed\x1f"


def pending_key(partition: int) -> bytes:
    return f"pending\x1f{partition}".encode()


def operator_key(index: int, name: str) -> bytes:
    return f"operator\x1f{index}\x1f{name}".encode()


class Changelog:
    """The changelog's contents as of the last commit (``table``), and the changes of the open transaction."""

    def __init__(self, topic: str, table: dict[bytes, bytes]) -> None:
        self.topic = topic
        self.table = table
        self.unsent: dict[bytes, bytes] = {}
        """Changes of the open transaction: key → new value."""
        self._closed = [json.loads(value) for key, value in table.items() if key.startswith(CLOSED)]
        self._closed_written = max((record["n"] + 1 for record in self._closed), default=0)

    @classmethod
    def load(cls, log: Log, topic: str) -> Changelog:
        """The changelog's committed contents: the newest value of each key."""
        end = log.end_offsets(topic).get(0, 0)
        return cls(topic, {message.key: message.value for message in read_range(log, topic, 0, 0, end) if message.key})

    def put(self, key: bytes, value: bytes) -> None:
        """Write ``value`` under ``key`` with the open transaction, unless it is there already."""
        if self.table.get(key) == value:
            self.unsent.pop(key, None)
        else:
            self.unsent[key] = value

    def put_closed(self, closed: list[tuple[int, str, bool]]) -> None:
        """Journal the groups closed in the open transaction: (input partition, group id, given up)."""
        n = self._closed_written
        self.put(CLOSED + str(n % CLOSED_SLOTS).encode(), json.dumps({"n": n, "closed": closed}).encode())

    def closed(self, partition: int) -> list[tuple[str, bool]]:
        """(group id, given up) of the groups of ``partition`` in the window, oldest first."""
        records = sorted(self._closed, key=lambda record: record["n"])
        return [(gid, expired) for record in records for p, gid, expired in record["closed"] if p == partition]

    def send(self, producer: TransactionalProducer) -> None:
        """Send the open transaction's changes through ``producer`` (inside that transaction)."""
        for key, value in self.unsent.items():
            producer.send(self.topic, value, key=key, partition=0)

    def committed(self) -> None:
        """The transaction that carried the changes committed: they are the contents now."""
        for key, value in self.unsent.items():
            self.table[key] = value
            if key.startswith(CLOSED):
                record = json.loads(value)
                self._closed = [kept for kept in self._closed if kept["n"] % CLOSED_SLOTS != record["n"] % CLOSED_SLOTS]
                self._closed.append(record)
                self._closed_written = record["n"] + 1
        self.unsent.clear()

    def discard(self) -> None:
        """The transaction that carried the changes aborted: forget them."""
        self.unsent.clear()
