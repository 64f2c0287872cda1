"""The embedded log fences a group member by generation (Reliability IV, scenario 4).

Member A (``paused_member``, its own process) polls offsets 0-9 of a one-partition topic and stops
(SIGSTOP) before committing. Member B joins, takes the partition, reads all 40 records and commits
40; once A's lease ran out B's heartbeat expires it, and B leaves. A is continued: its heartbeat
puts it back in the group, whose rows now deal the partition to A again, and A commits the position
it held before the pause (10). The old fencing checked only the rows, so that commit went through:
the group's offset went back from 40 to 10 and A read 10-39 again from its old position. Fenced by
generation, A's stale commit is refused, its partitions are revoked at its next poll, and it reads
on from 40: nothing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from astraflow.log import TopicPartition, TopicSpec, open_log
from tests.integration.paused_member import members

REPO = Path(__file__).resolve().parents[2]
SESSION_S = 1.0
WAIT_S = 60.0


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(condition, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stopped(process: subprocess.Popen) -> bool:
    return Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_a_member_paused_past_its_lease_commits_nothing_stale_and_reads_on_from_the_group_offset(
    tmp_path: Path,
) -> None:
    path, a_out = tmp_path / "log.sqlite", tmp_path / "a.jsonl"
    with open_log("embedded", path=path) as log:
        log.create_topic(TopicSpec("work", partitions=1))
        with log.producer() as producer:
            for i in range(40):
                producer.send("work", f"r{i}".encode())
            producer.flush()
        argv = ["paused_member", str(path), "work", "g", str(SESSION_S), str(a_out)]
        a = subprocess.Popen([sys.executable, "-m", "tests.integration.paused_member", *argv[1:]], cwd=REPO)
        try:
            wait_until(lambda: bool(events(a_out)) and stopped(a), "A to poll and stop")
            assert events(a_out)[0] == {"polled": list(range(10))}
            b = log.consumer("g", session_timeout_s=SESSION_S)
            b.subscribe(["work"])
            read: list[int] = []
            deadline = time.monotonic() + WAIT_S
            while len(read) < 40:  # B gets the partition once A's lease ran out
                assert time.monotonic() < deadline, f"B read {read}"
                read += [m.offset for m in b.poll(max_records=100, timeout=0.5)]
            b.commit()
            wait_until(lambda: members(path, "g") == 1, "B's heartbeat to expire A's lease")
            b.close()
            assert log.group_offsets()["g"] == {TopicPartition("work", 0): 40}
            a.send_signal(signal.SIGCONT)
            assert a.wait(timeout=WAIT_S) == 0
        finally:
            if a.poll() is None:
                a.send_signal(signal.SIGCONT)
                a.kill()
                a.wait()
        after = events(a_out)[1:]
        assert log.group_offsets()["g"] == {TopicPartition("work", 0): 40}  # never back to 10
    assert "rejected" in after[0]["stale_commit"]
    assert [offset for event in after[1:] for offset in event.get("read", [])] == []  # nothing again
