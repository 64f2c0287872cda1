"""The stream runtimes on a real Kafka broker, as ``astraflow stream`` processes (mostly faust's).

1. The same trajectories topic - accepted groups, zero-variance groups, a group with a NaN
   reward, one with a member of garbage bytes, a redelivered member, a never-completed group and
   unkeyed garbage - is processed by the native runtime and then, from the start again, by the
   faust runtime: the two emit the same samples as a multiset, report the same groups, and
   dead-letter the same records.
2. A faust worker killed with SIGKILL twice - once holding only half-filled groups whose
   offsets it committed, once while its open transaction holds samples - and restarted each time
   loses no group and emits none twice: its transactions commit outputs, table changes and input
   offsets together, and the samples of the transaction cut short are never read.
3. The native runtime on Kafka, killed with half its groups complete, has committed exactly the
   complete ones (its commits wait for its samples' acknowledgements, never pass a half-filled
   group), and the restarted processor emits each of the others once.
4. Records that faust leaves out of the agent's stream (as faust-streaming can around an
   assignment) are read from the log and handled in their place: no group is lost, none is
   emitted twice, and every offset is committed. This worker runs in the test's process, so
   that its stream can leave records out.
5. A faust worker stopped halfway through a stateful pipeline (reward normalisation, REINFORCE++,
   replay, fifo) and started again emits exactly the samples of one that ran throughout.
6. A faust worker that SIGKILLs itself at a named crash point of its commit path
   (``core/crashpoints.py``: ``faust.flush_table``, ``faust.commit_settled``), restarted, loses no group
   and emits none twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, KafkaError
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition as RdPartition
from confluent_kafka.admin import AdminClient

from astraflow.core.crashpoints import ENV as CRASH_ENV
from astraflow.log import Log, open_log
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, PromptStats, TrainSample, Trajectory
from tests.integration.test_native_exactly_once import STATEFUL

pytestmark = pytest.mark.kafka
GROUP = 4
CODEC = Codec()


def trajectory(group: str, index: int, reward: float, n: int = 3) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group}/{index}",
        episode_id=f"{group}/{index}",
        group_id=group,
        task_id=group,
        prompt_id=f"p-{group}",
        policy="main",
        workflow="math",
        prompt_ids=np.arange(3, dtype=np.int32),
        response_ids=np.arange(n, dtype=np.int32),
        behaviour_logprobs=np.full(n, -0.5, dtype=np.float32),
        token_versions=np.zeros(n, dtype=np.int32),
        loss_mask=np.ones(n, dtype=np.uint8),
        reward=reward,
        group_size=GROUP,
    )


def rewards(group: int) -> list[float]:
    """Mixed rewards (accepted), except every fifth group: all equal (dropped as zero_variance)."""
    return [1.0] * GROUP if group % 5 == 0 else [float((group + i) % 2) for i in range(GROUP)]


def member(group: int, index: int) -> tuple[bytes, bytes]:
    return f"g{group}".encode(), CODEC.encode(trajectory(f"g{group}", index, rewards(group)[index]))


class Run:
    """One run's config, topics and ``astraflow stream`` processes on the session broker."""

    def __init__(self, bootstrap: str, name: str, tmp_path: Path) -> None:
        self.run_dir = tmp_path / name
        self.run_dir.mkdir()
        self.config = self.run_dir / "config.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "run": name,
                    "log": {"backend": "kafka", "bootstrap": bootstrap, "partitions": 2},
                    "rollout": {"group_size": GROUP},
                }
            )
        )
        self.bootstrap = bootstrap
        self.log: Log = open_log("kafka", bootstrap=bootstrap)
        self.topics = RunTopics(name, "math", ("main",))
        self.topics.ensure(self.log, 2)
        self.producer = self.log.producer()
        self.group = f"{name}.stream.main"  # both runtimes' consumer group
        self.processes: list[subprocess.Popen] = []

    def produce(self, records: list[tuple[bytes | None, bytes]]) -> None:
        for key, value in records:
            self.producer.send(self.topics.trajectories("main"), value, key=key)
        self.producer.flush()

    def stream(self, *options: str, crash_at: str | None = None) -> subprocess.Popen:
        """An ``astraflow stream`` process; with ``crash_at`` it SIGKILLs itself at that named crash point."""
        out = (self.run_dir / f"stream-{len(self.processes)}.out").open("wb")
        env = {key: value for key, value in os.environ.items() if key != CRASH_ENV}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "astraflow.cli",
                "stream",
                str(self.config),
                "--run-dir",
                str(self.run_dir),
                *options,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env if crash_at is None else {**env, CRASH_ENV: crash_at},
        )
        self.processes.append(process)
        return process

    def read(self, topic: str, record: type, committed: bool = True) -> list:
        """Every committed record of ``topic`` (or every record), decoded: read until each partition reports its end.

        The end of a partition for a read_committed reader is its last stable offset (the first
        record of a transaction still open), not the high watermark that ``Consumer.lag`` uses;
        the high watermark also counts the transaction markers, which no reader receives.
        """
        partitions = self.log.describe_topic(topic).partitions
        isolation = "read_committed" if committed else "read_uncommitted"
        consumer = RdConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "unused",
                "enable.partition.eof": True,
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 20,
            }
        )
        consumer.assign([RdPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        records, ended = [], set()
        while len(ended) < partitions:
            for message in consumer.consume(10_000, timeout=0.2):
                if message.error() is None:
                    value = CODEC.decode(message.value(), expect=record) if record is not None else None
                    records.append(value if record is not None else (message.partition(), message.offset()))
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                else:
                    raise AssertionError(f"reading {topic}: {message.error()}")
        consumer.close()
        return records

    def in_open_transaction(self, topic: str) -> bool:
        """Whether ``topic``'s partition 0 holds records of a transaction not yet ended: its end for a
        read_committed reader (the last stable offset) is below its high watermark."""
        ends = []
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = RdConsumer(
                {"bootstrap.servers": self.bootstrap, "group.id": "unused", "isolation.level": isolation}
            )
            ends.append(consumer.get_watermark_offsets(RdPartition(topic, 0), timeout=10, cached=False)[1])
            consumer.close()
        return ends[0] < ends[1]

    def committed(self) -> dict[int, int]:
        offsets = self.log.group_offsets().get(self.group, {})
        return {tp.partition: offset for tp, offset in offsets.items() if tp.topic == self.topics.trajectories("main")}

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.producer.close()
        self.log.close()


@pytest.fixture
def make_run(kafka_bootstrap: str, tmp_path: Path, unique: str) -> Iterator[Callable[[str], Run]]:
    runs: list[Run] = []

    def make(name: str) -> Run:
        runs.append(Run(kafka_bootstrap, f"{name}{unique}", tmp_path))
        return runs[-1]

    yield make
    for run in runs:
        run.close()


def wait_for(condition: Callable[[], bool], timeout: float, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process is None or process.poll() is None, (
            f"the stream processor exited with {process.returncode} while waiting for {what}"
        )
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.2)


def uncommitted(run: Run) -> int:
    """Samples written in transactions that are open or were aborted."""
    topic = run.topics.samples("main")
    return len(run.read(topic, TrainSample, committed=False)) - len(run.read(topic, TrainSample))


def aborted_positions(run: Run) -> set[tuple[int, int]]:
    """(partition, offset) of every sample in a transaction that is open or was aborted. Counted while
    a transaction is open, this also takes in committed records behind it (a read_committed reader
    stops at the first open one, and faust writes from a producer per input partition); once none is
    open, it is exactly the aborted ones."""
    topic = run.topics.samples("main")
    return set(run.read(topic, None, committed=False)) - set(run.read(topic, None))


KILL_SLICE = 200
"""Records fed at a time to a worker that is to be killed mid-transaction (``kill_mid_transaction``)."""


def kill_mid_transaction(run: Run, worker: subprocess.Popen, slices: list[list], deadline: float) -> None:
    """SIGKILL ``worker`` while a transaction of its holds samples. ``slices`` of records go to it one
    at a time (popped), the next once it committed past everything before, so it keeps opening
    transactions however fast it ends them (it commits as soon as a batch is handled): freeze it
    (SIGSTOP), look, kill it if a transaction is open, else let it go on and look again.

    A transaction seen open may already be committing (its end request reached the coordinator
    before the freeze, which then writes the markers): the kill does not cut that one, and only a
    restart tells (``aborted_positions`` once no transaction is open)."""
    topic, source = run.topics.samples("main"), run.topics.trajectories("main")
    run.produce(slices.pop(0))
    while True:
        assert worker.poll() is None, f"the stream processor exited with {worker.returncode}"
        assert time.monotonic() < deadline, "timed out waiting for samples in an open transaction"
        worker.send_signal(signal.SIGSTOP)
        if run.in_open_transaction(topic):
            worker.kill()
            worker.wait()
            return
        worker.send_signal(signal.SIGCONT)
        if run.committed() == run.log.end_offsets(source):  # it ended every transaction so far: feed it more
            assert slices, "the worker handled every record without a transaction holding samples being caught"
            run.produce(slices.pop(0))


def each_group_once(run: Run, worker: subprocess.Popen, groups: int, timeout: float) -> list[TrainSample]:
    """Let ``worker`` report every one of ``groups`` and commit everything fed, stop it, and check that
    each group was reported once and each sample of an accepted group emitted once; the samples."""
    wait_for(
        lambda: len(run.read(run.topics.feedback(), PromptStats)) >= groups, timeout, "every group reported", worker
    )
    ends = run.log.end_offsets(run.topics.trajectories("main"))
    wait_for(lambda: run.committed() == ends, 30, "the worker to commit everything", worker)
    stop(worker)
    stats = run.read(run.topics.feedback(), PromptStats)
    assert sorted(s.group_id for s in stats) == sorted(f"g{g}" for g in range(groups))  # each group reported once
    samples = run.read(run.topics.samples("main"), TrainSample)
    emitted = Counter(s.sample_id for s in samples)
    assert max(emitted.values()) == 1, [sample for sample, count in emitted.items() if count > 1][:10]
    assert set(emitted) == {f"g{g}/{i}" for g in range(groups) if g % 5 for i in range(GROUP)}
    return samples


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def sample_key(sample: TrainSample) -> tuple:
    return (
        sample.sample_id,
        round(sample.advantage, 6),
        tuple(sample.operators),
        sample.replayed,
        sample.deadline_version,
    )


def test_faust_and_native_emit_the_same_samples(make_run: Callable[[str], Run]) -> None:
    run = make_run("same")
    groups = 12
    records = [member(g, i) for g in range(groups) for i in range(GROUP)]
    records[5] = (b"g1", CODEC.encode(trajectory("g1", 1, float("nan"))))  # g1: dead-lettered member -> incomplete
    records[9] = (b"g2", b"\x00garbage")  # g2: undecodable member, keyed -> incomplete
    records.insert(14, records[13])  # g3/1 redelivered
    records += [member(99, 0), member(99, 1), (None, b"unkeyed garbage")]  # g99 never completes
    run.produce(records)

    native = run.stream("--runtime", "native")
    wait_for(
        lambda: len(run.read(run.topics.feedback(), PromptStats)) == groups, 60, "native to report every group", native
    )
    stop(native)
    native_samples = run.read(run.topics.samples("main"), TrainSample)
    admin = AdminClient({"bootstrap.servers": run.bootstrap})
    admin.delete_consumer_groups([run.group], request_timeout=30)[run.group].result()  # faust starts over

    worker = run.stream()  # Kafka: faust by default
    wait_for(
        lambda: len(run.read(run.topics.feedback(), PromptStats)) == 2 * groups,
        90,
        "faust to report every group",
        worker,
    )
    stop(worker)
    samples = run.read(run.topics.samples("main"), TrainSample)
    faust_samples = samples[len(native_samples) :]

    assert Counter(map(sample_key, faust_samples)) == Counter(map(sample_key, native_samples))
    assert len(native_samples) == GROUP * sum(1 for g in range(3, groups) if g % 5)  # g0 g5 g10 equal, g1 g2 incomplete
    stats = run.read(run.topics.feedback(), PromptStats)
    reports = [
        Counter((s.group_id, s.accepted, s.drop_reason.split(":")[0]) for s in half)
        for half in (stats[:groups], stats[groups:])
    ]
    assert reports[0] == reports[1]
    letters = run.read(run.topics.deadletter("stream"), DeadLetter)
    assert Counter((d.key, d.reason.split(":")[0]) for d in letters) == {
        (b"g1", "invalid trajectory g1/1"): 2,
        (b"g2", "undecodable trajectory"): 2,
        (None, "undecodable trajectory"): 2,
    }


def test_a_killed_faust_worker_loses_no_group_and_emits_none_twice(make_run: Callable[[str], Run]) -> None:
    run = make_run("kill")
    groups = 1000
    first, second = (
        [member(g, i) for g in range(groups) for i in (0, 1)],
        [member(g, i) for g in range(groups) for i in (2, 3)],
    )
    run.produce(first)
    worker = run.stream("--runtime", "faust")
    ends = run.log.end_offsets(run.topics.trajectories("main"))
    wait_for(lambda: run.committed() == ends, 90, "the worker to commit past the first members of every group", worker)
    assert run.read(run.topics.feedback(), PromptStats) == []  # every group is half full, and held only by the table
    worker.kill()
    worker.wait()

    slices = [second[i : i + KILL_SLICE] for i in range(0, len(second), KILL_SLICE)]
    deadline = time.monotonic() + 180
    while True:  # until a kill cuts a transaction that was not already committing
        kill_mid_transaction(run, run.stream("--runtime", "faust"), slices, deadline)
        emitted_before_kill = len(run.read(run.topics.samples("main"), TrainSample))
        aborted = uncommitted(run)
        ends_at_kill = run.log.end_offsets(run.topics.samples("main"))
        worker = run.stream("--runtime", "faust")  # fences the killed one: its open transaction is aborted
        ends = run.log.end_offsets(run.topics.trajectories("main"))
        wait_for(lambda: run.committed() == ends, 90, "the worker to commit what was fed before the kill", worker)
        if aborted_positions(run):  # exact: the worker ended its transactions, and the killed one's is over
            break
        stop(worker)  # the kill caught a transaction committing: nothing was cut, try again with the next slice
    for rest in slices:
        run.produce(rest)

    samples = each_group_once(run, worker, groups, 90)
    assert aborted > 0 and emitted_before_kill < len(samples)  # the kill cut a transaction holding samples
    # ... whose samples were written again, in a transaction that committed: no transaction the restarted
    # worker began was aborted (every aborted sample lies below where the partitions ended at the kill)
    after = aborted_positions(run)
    assert after and all(offset < ends_at_kill[partition] for partition, offset in after), (after, ends_at_kill)
    assert len(after) <= aborted


@pytest.mark.parametrize("point", ["faust.flush_table", "faust.commit_settled"])
def test_a_faust_worker_killed_at_a_named_crash_point_loses_no_group_and_emits_none_twice(
    make_run: Callable[[str], Run], point: str
) -> None:
    """The worker SIGKILLs itself at ``point`` (``core/crashpoints.py``) on its second pass: in a commit,
    before the table's changes are written; after a batch that emitted samples settled, before its
    commit. Records arrive in three slices, each fed once the one before is committed; each of the first
    two completes some groups (so samples are emitted and settled commits happen) and leaves the rest
    half filled, held only by the table, when the kill comes. A restarted worker reports every group
    once and emits each sample once."""
    run = make_run(f"crash{point.split('.')[1]}")
    groups = 200
    slices = [
        [member(g, i) for g in range(groups) for i in (0, 1)] + [member(g, i) for g in range(50) for i in (2, 3)],
        [member(g, 2) for g in range(50, groups)] + [member(g, 3) for g in range(50, 100)],
        [member(g, 3) for g in range(100, groups)],
    ]
    worker = run.stream("--runtime", "faust", crash_at=f"{point}#2")
    while slices and worker.poll() is None:
        run.produce(slices.pop(0))
        ends = run.log.end_offsets(run.topics.trajectories("main"))
        wait_for(lambda: worker.poll() is not None or run.committed() == ends, 90, f"a commit or a kill at {point}")
    assert worker.wait(timeout=90) == -signal.SIGKILL, f"the worker did not die at {point}"

    worker = run.stream("--runtime", "faust")
    for rest in slices:
        run.produce(rest)
    each_group_once(run, worker, groups, 120)


def test_a_killed_native_processor_resumes_from_its_commits_on_kafka(make_run: Callable[[str], Run]) -> None:
    """The native runtime on Kafka commits each poll in a transaction, with its half-filled groups
    in its changelog: killed with half its groups complete, it has committed every record it read,
    and the restarted processor completes each of the others once, from the changelog."""
    run = make_run("native")
    groups = 400
    run.produce([member(g, i) for g in range(groups // 2) for i in range(GROUP)])  # complete groups first
    run.produce([member(g, i) for g in range(groups // 2, groups) for i in (0, 1)])
    read = run.log.end_offsets(run.topics.trajectories("main"))
    processor = run.stream("--runtime", "native")
    wait_for(
        lambda: run.committed() == read, 90, "the processor to commit every record, half-filled groups too", processor
    )
    processor.kill()
    processor.wait()
    assert sorted(s.group_id for s in run.read(run.topics.feedback(), PromptStats)) == sorted(
        f"g{g}" for g in range(groups // 2)
    )

    run.produce([member(g, i) for g in range(groups // 2, groups) for i in (2, 3)])
    processor = run.stream("--runtime", "native")
    ends = run.log.end_offsets(run.topics.trajectories("main"))
    wait_for(lambda: run.committed() == ends, 90, "the restarted processor to commit everything", processor)
    stop(processor)
    assert sorted(s.group_id for s in run.read(run.topics.feedback(), PromptStats)) == sorted(
        f"g{g}" for g in range(groups)
    )
    emitted = Counter(s.sample_id for s in run.read(run.topics.samples("main"), TrainSample))
    assert max(emitted.values()) == 1 and set(emitted) == {
        f"g{g}/{i}" for g in range(groups) if g % 5 for i in range(GROUP)
    }


class LeavingOut:
    """A faust worker whose stream leaves out the records at ``skip`` (partition, offset) once;
    with ``recover=False``, one that does not read them from the log either (as before the fix)."""

    def __init__(self, run: Run, skip: set[tuple[int, int]], recover: bool = True) -> None:
        from astraflow.infra.launch.process import resolve_config
        from astraflow.runtime.context import ComponentContext
        from astraflow.streams.runtimes.faust_runtime import FaustStreamProcessor

        left_out = set(skip)

        class Processor(FaustStreamProcessor):
            async def _events(self, stream) -> AsyncIterator:
                async for event in super()._events(stream):
                    if left_out and (event.message.partition, event.message.offset) in left_out:
                        left_out.discard((event.message.partition, event.message.offset))
                        continue
                    yield event

            async def _recover_skipped(self, *args) -> None:
                if recover:
                    await super()._recover_skipped(*args)

        self.left_out = left_out
        self.ctx = ComponentContext(
            resolve_config(run.config, None, None, {"stream.runtime": "faust"}), run.run_dir, "stream"
        )
        self.processor = Processor(self.ctx, "main")
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.processor.run(self.stop)
        except BaseException as exc:  # what the process would exit with
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.ctx.close()


def test_records_faust_leaves_out_are_handled_from_the_log(make_run: Callable[[str], Run]) -> None:
    run = make_run("leftout")
    groups = 40
    run.produce([member(g, i) for g in range(groups) for i in range(GROUP)])
    ends = run.log.end_offsets(run.topics.trajectories("main"))
    assert min(ends.values()) > 20, ends
    # the first records of a partition (nothing committed yet), a run in the middle, and one near the end
    skip = {(p, offset) for p, end in ends.items() for offset in (0, 1, 9, 10, 11, end - 2)}
    worker = LeavingOut(run, skip)
    try:
        wait_for(
            lambda: len(run.read(run.topics.feedback(), PromptStats)) >= groups or not worker.thread.is_alive(),
            90,
            "every group to be reported",
        )
        wait_for(lambda: run.committed() == ends, 30, "the worker to commit everything")
    finally:
        worker.close()

    assert worker.error is None
    assert not worker.left_out  # faust did deliver each of them, and the stream left it out
    assert worker.processor.recovered == len(skip)
    stats = run.read(run.topics.feedback(), PromptStats)
    assert sorted(s.group_id for s in stats) == sorted(f"g{g}" for g in range(groups))  # each group reported once
    emitted = Counter(s.sample_id for s in run.read(run.topics.samples("main"), TrainSample))
    assert max(emitted.values()) == 1
    assert set(emitted) == {f"g{g}/{i}" for g in range(groups) if g % 5 for i in range(GROUP)}


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning"
)  # the consumer thread, ended at once
def test_a_worker_that_stops_committing_fails(make_run: Callable[[str], Run], monkeypatch: pytest.MonkeyPatch) -> None:
    from astraflow.streams.runtimes import faust_runtime

    monkeypatch.setattr(faust_runtime, "STALL_LIMIT_S", 3.0)
    run = make_run("stall")
    run.produce([member(g, i) for g in range(20) for i in range(GROUP)])
    before = set(threading.enumerate())
    # faust never commits partition 0 past offset 2 again (it would pass over a single missing offset)
    worker = LeavingOut(run, {(0, 2), (0, 3)}, recover=False)
    try:
        wait_for(lambda: not worker.thread.is_alive(), 90, "the worker to fail")
    finally:
        worker.close()
    assert isinstance(worker.error, faust_runtime.CommitStalled), worker.error
    assert not [t.name for t in threading.enumerate() if not t.daemon and t not in before]  # the process can exit
    assert "partition 0" in str(worker.error) and "offset 4 is acked" in str(worker.error)
    assert run.committed().get(0, 0) <= 2


def test_faust_commits_a_handled_batch_without_waiting_for_its_timer(
    make_run: Callable[[str], Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Samples are readable once the records that arrived are handled, not at faust's next timed commit (issue
    #25: the timer held every version's batch for up to half a second): with the timer an hour away, the whole
    batch is still committed."""
    from astraflow.streams.runtimes import faust_runtime

    monkeypatch.setattr(faust_runtime, "COMMIT_INTERVAL_S", 3600.0)
    run = make_run("eager")
    groups = 20
    run.produce([member(g, i) for g in range(groups) for i in range(GROUP)])
    ends = run.log.end_offsets(run.topics.trajectories("main"))
    worker = LeavingOut(run, set())
    try:
        wait_for(lambda: run.committed() == ends or not worker.thread.is_alive(), 90, "the worker to commit the batch")
    finally:
        worker.close()
    assert worker.error is None
    emitted = {s.sample_id for s in run.read(run.topics.samples("main"), TrainSample)}
    assert emitted == {f"g{g}/{i}" for g in range(groups) if g % 5 for i in range(GROUP)}


def test_a_restarted_faust_worker_keeps_its_operators_state(make_run: Callable[[str], Run]) -> None:
    """Reward statistics, the REINFORCE++ window and the replay buffer (with its random generator)
    go with each commit into the worker's table, per input partition, and come back with it: a worker
    stopped after half the groups and started again emits the samples of one that ran throughout.
    Before, they lived in the worker's memory: its restart began from fresh statistics and an empty
    replay buffer."""
    groups = 24
    members = [
        (f"s{g}".encode(), CODEC.encode(trajectory(f"s{g}", i, 1.0 if g == 5 else float((3 * g + 5 * i) % 7))))
        for g in range(groups)
        for i in range(GROUP)
    ]
    half = len(members) // 2 + 2  # the group at the cut is split across the restart
    outputs = []
    for name, restart in [("whole", False), ("restarted", True)]:
        run = make_run(name)
        config = yaml.safe_load(run.config.read_text())
        config["stream"] = {"max_staleness": 1000, "pipeline": STATEFUL}
        run.config.write_text(yaml.safe_dump(config))
        run.produce(members[:half] if restart else members)
        processor = run.stream("--runtime", "faust")
        if restart:
            first = half // GROUP
            wait_for(
                lambda: len(run.read(run.topics.feedback(), PromptStats)) >= first, 120, "the first half", processor
            )
            stop(processor)
            run.produce(members[half:])
            processor = run.stream("--runtime", "faust")
        wait_for(lambda: len(run.read(run.topics.feedback(), PromptStats)) >= groups, 120, "every group", processor)
        stop(processor)
        outputs.append(Counter(sample_key(s) for s in run.read(run.topics.samples("main"), TrainSample)))
    whole, restarted = outputs
    assert any(key[3] for key in whole)  # replayed copies
    assert len({key[1] for key in whole}) > 4  # normalised advantages, not a handful of values
    assert restarted == whole
