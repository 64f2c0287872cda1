"""The native stream runtime's changelog: what a processor remembers, journaled with its commits.

Topic ``{run}.stream.{policy}.changelog`` (compacted), with as many partitions as the policy's
trajectories topic: partition ``p`` holds the state of input partition ``p``, so whichever
processor instance is assigned that input partition restores exactly its state, and instances of
one policy never write the same partition at once. It is written only in the processors'
transactions, together with the outputs and input offsets of the poll that changed it. Keys of
partition ``p`` (``␟`` is the ASCII unit separator, which no id contains):

- ``pending␟{p}``: the half-filled groups of the input partition (``pending.snapshot``);
- ``closed␟{slot}``: the groups of the partition one transaction closed (completed or given up),
  as JSON ``{"n": n, "closed": [[p, group id, given up], ...]}``; the partition's n-th such record
  goes to slot ``n % CLOSED_SLOTS``. So the changelog holds the groups closed by the last
  ``CLOSED_SLOTS`` transactions that closed any - at least that many groups, usually many more -
  and a restarted processor still drops a late copy of them (dedup at stream entry, a defence:
  with exactly-once stages upstream, copies come only from mirrored or re-sent topics);
- ``operator␟{index}␟{name}``: the ``state_dict`` of the stateful operator at ``index`` of the
  partition's pipeline (group operators, then mixers, then the ordering);
- ``offline␟{index}``: the position of the partition's source for its ``index``-th offline mixer;
- ``clock``: the log's time, the newest record timestamp the processor had seen (ms), which group
  timeouts use.

A key is written in a transaction only when its value changed. The Log API cannot delete a key
(no tombstones), so the key space is bounded instead: 1 + ``CLOSED_SLOTS`` + stateful operators
+ offline mixers + 1 per partition, and compaction keeps the newest record of each. Kafka leaves
its active segment uncompacted, so there a restart may read more than the newest records.

``load`` reads one partition from its start to its end (``read_committed`` on Kafka). A processor
creates its transactional producer first: that fences its predecessor and ends the transaction
the predecessor left open. A partition taken over from another instance that died is read once
that instance's open transaction has ended (Kafka aborts it after the producer's transaction
timeout), so what ``load`` reads is exactly what was committed.
"""

from __future__ import annotations

import json

from astraflow.log import Log, TransactionalProducer
from astraflow.streams.runtimes.pending import read_range

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

    def __init__(self, topic: str, table: dict[bytes, bytes], partition: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.table = table
        self.unsent: dict[bytes, bytes] = {}
        """Changes of the open transaction: key → new value."""
        self._closed = [json.loads(value) for key, value in table.items() if key.startswith(CLOSED)]
        self._closed_written = max((record["n"] + 1 for record in self._closed), default=0)

    @classmethod
    def load(cls, log: Log, topic: str, partition: int) -> Changelog:
        """The committed contents of the changelog's ``partition``: the newest value of each key."""
        end = log.end_offsets(topic).get(partition, 0)
        records = read_range(log, topic, partition, 0, end)
        return cls(topic, {message.key: message.value for message in records if message.key}, partition)

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
            producer.send(self.topic, value, key=key, partition=self.partition)

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
