"""A consumer-group member of the embedded log that stops itself between a poll and its commit.

``python -m tests.integration.paused_member LOG TOPIC GROUP SESSION_S OUT`` subscribes to ``TOPIC`` in
``GROUP``, polls once, writes ``{"polled": [offsets]}`` to ``OUT`` and sends itself SIGSTOP: the whole
process stops (its heartbeat thread too), as under a debugger, a long GC or ``kill -STOP``, right
where a stage holds records it has not committed yet. Once continued (SIGCONT), it waits until its
heartbeat thread has put its expired row back in the group (the rejoin happens before the commit,
the order in which the old fencing let a stale commit through), then:

1. commits the position after what it polled before it stopped, and writes ``{"stale_commit": "ok"}``
   or the error;
2. polls on until it has read to ``TOPIC``'s end, writing ``{"read": [offsets]}`` per poll, and its
   commits: what it reads after the pause must start at the group's committed offset, not at the
   position it held before it stopped.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

from astraflow.core.errors import LogError
from astraflow.log import TopicPartition, open_log

WAIT_S = 60.0


def members(path: Path, group_id: str) -> int:
    """The group's member rows, read from the log's file (the test's view of the group)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM group_members WHERE group_id = ?", (group_id,)).fetchone()[0]


def main(path: str, topic: str, group_id: str, session_s: str, out_path: str) -> None:
    with open(out_path, "a", buffering=1) as out, open_log("embedded", path=path) as log:
        consumer = log.consumer(group_id, session_timeout_s=float(session_s))
        consumer.subscribe([topic])
        records = consumer.poll(max_records=10, timeout=5.0)
        out.write(json.dumps({"polled": [m.offset for m in records]}) + "\n")
        os.kill(os.getpid(), signal.SIGSTOP)
        deadline = time.monotonic() + WAIT_S
        while members(Path(path), group_id) == 0:  # the other member left; this one's row comes back
            if time.monotonic() > deadline:
                raise SystemExit("the heartbeat never put the member back")
            time.sleep(0.05)
        try:
            consumer.commit({TopicPartition(topic, 0): records[-1].offset + 1})
            out.write(json.dumps({"stale_commit": "ok"}) + "\n")
        except LogError as exc:
            out.write(json.dumps({"stale_commit": str(exc)}) + "\n")
        end, partition = log.end_offsets(topic)[0], TopicPartition(topic, 0)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            batch = consumer.poll(max_records=10, timeout=0.5)
            if batch:
                out.write(json.dumps({"read": [m.offset for m in batch]}) + "\n")
                consumer.commit()
            if partition in consumer.assignment() and consumer.position(partition) >= end:
                break
        consumer.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
