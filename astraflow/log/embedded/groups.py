"""Consumer groups of the embedded log: leases in a table, and no coordinator.

``group_members`` holds one row per live member (subscribed topics, last heartbeat, session
timeout); ``group_generations`` counts the membership changes of each group.

Lease and rebalance algorithm:

1. ``subscribe`` inserts (or updates) the member's row and bumps the group's generation.
2. A heartbeat thread per member refreshes its ``heartbeat_ms`` every quarter session and, in the
   same transaction, deletes every member of the group whose lease ran out
   (``heartbeat_ms + session_ms < now``), bumping the generation when it deleted one. A member
   that finds its own row gone (it was expired while stalled) inserts it again: a rejoin. A
   rejoined member's next poll revokes every partition it held (an empty assignment, so the
   application drops what it kept of them), and the poll after takes its new share, from the
   committed offsets.
   The thread stops refreshing once the application has not polled for ``MAX_POLL_INTERVAL_S``
   (Kafka's ``max.poll.interval.ms``), so a hung main loop loses its partitions too.
3. ``close`` deletes the row and bumps the generation at once: the others take over on their
   next poll, not a session timeout later.
4. Every member computes the assignment itself with one pure function (``assign_round_robin``)
   of the sorted member rows and the partition counts of their topics, again on every poll
   where the generation or a partition count differs from what it saw last. All members read
   the same rows, so they agree without talking to each other. With a new generation the consumer
   forgets every position, as Kafka's eager rebalance does: a partition it keeps may have been
   another member's in between (while this one was paused), so it reads on from the committed
   offset, never from where it was.
5. Commits are fenced by generation: the committing transaction reads the group's generation, and
   a member whose assignment was computed at another one (the group changed since its last poll)
   commits nothing; otherwise it writes only the partitions that belong to it by the rows. So a
   member paused past its lease (SIGSTOP, a long GC) commits nothing when it resumes - not even for
   a partition the rows deal back to it - until a poll has shown it the change.

So between a membership change and the old owner's next poll, old and new owner may both return
records of a moved partition; the old owner's commits for it are rejected (step 5), and the new
owner resumes from the last commit made while the old owner held it. Delivery is at-least-once;
downstream components drop the duplicates by record id.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from astraflow.core.errors import LogError
from astraflow.log.base import TopicPartition
from astraflow.log.embedded.store import Store, now_ms

logger = logging.getLogger(__name__)

MAX_POLL_INTERVAL_S = 300.0


def assign_round_robin(
    members: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """Deal the partitions, in (topic, partition) order, to the sorted members subscribed to each topic.

    ``members`` maps member id to its topics, ``partitions`` topic to partition count. The turn
    carries over from topic to topic, so many one-partition topics still spread evenly.
    """
    shares: dict[str, list[TopicPartition]] = {member: [] for member in members}
    ordered = sorted(members)
    turn = 0
    for topic in sorted(partitions):
        takers = [member for member in ordered if topic in members[member]]
        for partition in range(partitions[topic]) if takers else ():
            shares[takers[turn % len(takers)]].append(TopicPartition(topic, partition))
            turn += 1
    return shares


@dataclass(frozen=True)
class GroupState:
    """One snapshot of a group: what every member's assignment is computed from."""

    generation: int
    members: dict[str, tuple[str, ...]]
    partitions: tuple[tuple[str, int], ...]

    @classmethod
    def load(cls, conn: sqlite3.Connection, group_id: str) -> GroupState:
        row = conn.execute("SELECT generation FROM group_generations WHERE group_id = ?", (group_id,)).fetchone()
        members = {
            member: tuple(json.loads(topics))
            for member, topics in conn.execute(
                "SELECT member_id, topics FROM group_members WHERE group_id = ?", (group_id,)
            )
        }
        names = sorted(set().union(*members.values()))
        counts = conn.execute(
            f"SELECT name, partitions FROM topics WHERE name IN ({', '.join('?' * len(names))})", names
        ).fetchall()
        return cls(0 if row is None else row[0], members, tuple(sorted(counts)))

    def share(self, member_id: str) -> list[TopicPartition]:
        return assign_round_robin(self.members, dict(self.partitions)).get(member_id, [])


class GroupMember:
    """One consumer's seat in a group: its lease, its heartbeat thread, its share of partitions."""

    def __init__(self, path: Path, group_id: str, session_timeout_s: float) -> None:
        self.group_id = group_id
        self.member_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._path = path
        self._session_ms = max(1, round(session_timeout_s * 1000))
        self._topics: tuple[str, ...] = ()
        self._seen: tuple[int, tuple[tuple[str, int], ...]] | None = None
        """(generation, partition counts) the current share was computed at; ``None``: no share taken."""
        self.new_generation = False
        """Whether the share ``share_if_changed`` returned last came with a new generation (step 4)."""
        self._joined = False
        self._rejoined = False
        """Set when this member's row was found expired and inserted again (step 2)."""
        self._last_poll = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def join(self, store: Store, topics: Sequence[str]) -> None:
        """Enter the group for ``topics`` (step 1) and start heart-beating (step 2)."""
        self._topics = tuple(sorted(set(topics)))
        self._seen = None
        store.write(lambda conn: self._heartbeat(conn, changed=True))
        self._joined, self._rejoined = True, False
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.member_id}", daemon=True)
            self._thread.start()

    def share_if_changed(self, store: Store) -> list[TopicPartition] | None:
        """This member's partitions if the group changed since the last call (step 4), else ``None``."""
        self._last_poll = time.monotonic()
        state = store.read(lambda conn: GroupState.load(conn, self.group_id))
        if self.member_id not in state.members:
            store.write(self._heartbeat)  # a rejoin
        if self._rejoined:
            self._rejoined, self._seen = False, None
            logger.info(
                "member %s was expired from group %s; rejoined, its partitions revoked", self.member_id, self.group_id
            )
            return []
        seen = (state.generation, state.partitions)
        if seen == self._seen:
            return None
        self.new_generation = self._seen is None or seen[0] != self._seen[0]
        self._seen = seen
        return state.share(self.member_id)

    def owned(self, conn: sqlite3.Connection) -> set[TopicPartition]:
        """The partitions this member may commit in ``conn``'s transaction (step 5): none when the group's
        generation is not the one its assignment was computed at, else its share by the rows."""
        state = GroupState.load(conn, self.group_id)
        if self._seen is None or state.generation != self._seen[0]:
            return set()
        return set(state.share(self.member_id))

    def leave(self, store: Store) -> None:
        """Stop heart-beating and hand the partitions over at once (step 3)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

        def delete(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM group_members WHERE group_id = ? AND member_id = ?", (self.group_id, self.member_id)
            )
            _bump(conn, self.group_id)

        store.write(delete)

    def _heartbeat(self, conn: sqlite3.Connection, changed: bool = False) -> None:
        now = now_ms()
        key = (self.group_id, self.member_id)
        topics = json.dumps(self._topics)
        if not conn.execute(
            "UPDATE group_members SET topics = ?, heartbeat_ms = ?, session_ms = ? "
            "WHERE group_id = ? AND member_id = ?",
            (topics, now, self._session_ms, *key),
        ).rowcount:
            conn.execute(
                "INSERT INTO group_members (group_id, member_id, topics, heartbeat_ms, session_ms) "
                "VALUES (?, ?, ?, ?, ?)",
                (*key, topics, now, self._session_ms),
            )
            changed = True
            self._rejoined = self._joined  # the row was gone after the first join: expired while stalled
        lapsed = "FROM group_members WHERE group_id = ? AND heartbeat_ms + session_ms < ?"
        expired = conn.execute(f"SELECT member_id {lapsed}", (self.group_id, now)).fetchall()
        if expired:
            conn.execute(f"DELETE {lapsed}", (self.group_id, now))
            logger.info("group %s: leases of %s expired", self.group_id, ", ".join(m for (m,) in expired))
        if changed or expired:
            _bump(conn, self.group_id)

    def _beat(self) -> None:
        store = Store(self._path)
        interval = max(0.05, self._session_ms / 4000)
        stalled = False
        try:
            while not self._stop.wait(interval):
                if time.monotonic() - self._last_poll > MAX_POLL_INTERVAL_S:
                    if not stalled:
                        logger.warning(
                            "member %s of group %s has not polled for %.0f s; letting its lease lapse",
                            self.member_id,
                            self.group_id,
                            MAX_POLL_INTERVAL_S,
                        )
                    stalled = True
                    continue
                stalled = False
                try:
                    store.write(self._heartbeat, timeout=self._session_ms / 1000)
                except LogError as exc:
                    logger.warning("heartbeat of %s in group %s failed: %s", self.member_id, self.group_id, exc)
        finally:
            store.close()


def _bump(conn: sqlite3.Connection, group_id: str) -> None:
    conn.execute(
        "INSERT INTO group_generations (group_id, generation) VALUES (?, 1)"
        " ON CONFLICT (group_id) DO UPDATE SET generation = generation + 1",
        (group_id,),
    )
