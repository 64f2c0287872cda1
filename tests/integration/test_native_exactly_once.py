"""The native stream runtime is exactly once, on both backends: each poll's outputs, its input
offsets and the processor's state (half-filled groups, closed group ids, operator state) commit
in one transaction, and a restarted processor goes on from the last commit.

Each test runs the processor loop in this process (``NativeStreamProcessor.run`` in a thread) on
the embedded log and on a real Kafka broker, stops it - or kills it, by raising from inside the
log at the moment the outputs are sent and the commit is due - and starts a new one on the same
run. What the tests wait for is a committed state of the log (samples, feedback, offsets), read
the way the trainer reads it (``read_committed`` on Kafka).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from astraflow.config import parse_config
from astraflow.consumers.trainer.batch_assembler import BatchAssembler
from astraflow.core.errors import TransactionAbortedError
from astraflow.core.metric_names import STREAM_REWINDS
from astraflow.log import Log, TopicPartition, TransactionalProducer
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import Metric, PromptStats, TrainSample
from astraflow.streams.operators.base import GroupBuffer
from astraflow.streams.runtimes import changelog
from astraflow.streams.runtimes.native import NativeStreamProcessor
from astraflow.streams.runtimes.pending import read_range
from tests.unit.test_stream_operators import traj

WAIT_S = 120.0


@pytest.fixture
def make_ctx(log_target: dict[str, str], tmp_path: Path, unique: str) -> Iterator[Callable[..., ComponentContext]]:
    """Contexts of stream processors on the test's log: one run per name, group size 2, one partition."""
    made: list[ComponentContext] = []

    def make(name: str = "eo", pipeline: list[dict] | None = None) -> ComponentContext:
        raw = {
            "run": f"{name}{unique}",
            "log": {"backend": log_target["backend"], "bootstrap": log_target.get("bootstrap"), "partitions": 1},
            "rollout": {"group_size": 2},
            "stream": {"max_staleness": 1000, **({"pipeline": pipeline} if pipeline else {})},
        }
        made.append(ComponentContext(parse_config(raw), tmp_path / name, "stream"))
        return made[-1]

    yield make
    for ctx in made:
        ctx.close()


def write(ctx: ComponentContext, members: list[tuple[str, int, float]]) -> None:
    """Append trajectories (group, member, reward) of groups of 2, stamped with their offset in log time."""
    topic = ctx.topics.trajectories("main")
    start = sum(ctx.log.end_offsets(topic).values())
    for offset, (group, index, reward) in enumerate(members, start):
        value = ctx.codec.encode(traj(group, index, reward, size=2))
        ctx.producer.send(topic, value, key=group.encode(), partition=0, timestamp_ms=1_000_000 + offset)
    ctx.producer.flush()


def visible(ctx: ComponentContext, topic: str, record: type) -> list:
    """Every committed record of ``topic``, in offset order (``read_committed`` on Kafka)."""
    end = ctx.log.end_offsets(topic).get(0, 0)
    return [ctx.codec.decode(m.value, expect=record) for m in read_range(ctx.log, topic, 0, 0, end)]


def committed(ctx: ComponentContext) -> int | None:
    """The stream processor's committed offset of trajectories partition 0."""
    offsets = ctx.log.group_offsets().get(f"{ctx.config.run}.stream.main", {})
    return offsets.get(TopicPartition(ctx.topics.trajectories("main"), 0))


def reported(ctx: ComponentContext) -> Counter[str]:
    """How many times each group was reported on the feedback topic."""
    return Counter(stats.group_id for stats in visible(ctx, ctx.topics.feedback(), PromptStats))


@contextlib.contextmanager
def running(processor: NativeStreamProcessor) -> Iterator[list[BaseException]]:
    """Run the processor loop in a thread; yields the list its failure lands in; stops it at the end."""
    stop, failures = threading.Event(), []

    def loop() -> None:
        try:
            processor.run(stop)
        except BaseException as exc:  # the test looks at it: a kill, or a failure to report
            failures.append(exc)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield failures
    finally:
        stop.set()
        thread.join(timeout=WAIT_S)
    assert not thread.is_alive(), "the processor did not stop"


def wait_for(condition: Callable[[], bool], what: str, failures: list[BaseException]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if failures:
            raise AssertionError(f"the processor failed while waiting for {what}") from failures[0]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def split_input() -> list[tuple[str, int, float]]:
    """Offsets 0-30 of the issue's case: group G at 10 and 30, group H at 20 (its other member
    comes later), complete filler groups f0..f13 everywhere else."""
    fillers = iter([(f"f{g}", i, float(i)) for g in range(14) for i in range(2)])
    special = {10: ("G", 0, 1.0), 20: ("H", 0, 1.0), 30: ("G", 1, 0.0)}
    return [special[offset] if offset in special else next(fillers) for offset in range(31)]


def test_a_group_split_across_a_half_filled_one_is_emitted_once_and_commits_move_past_it(make_ctx) -> None:
    ctx = make_ctx()
    write(ctx, split_input())
    with running(NativeStreamProcessor(ctx, "main")) as failures:
        wait_for(lambda: reported(ctx)["G"] == 1, "group G's feedback", failures)
    assert committed(ctx) == 31  # past G's last member, though H's first is at 20: H is in the changelog

    write(ctx, [("H", 1, 0.0)])  # offset 31
    with running(NativeStreamProcessor(ctx, "main")) as failures:  # the restarted processor
        wait_for(lambda: reported(ctx)["H"] == 1, "group H's feedback", failures)
    samples = Counter(sample.sample_id for sample in visible(ctx, ctx.topics.samples("main"), TrainSample))
    groups = ["G", "H"] + [f"f{g}" for g in range(14)]
    assert samples == Counter(f"{group}/{index}" for group in groups for index in range(2))  # each once
    assert reported(ctx) == Counter(groups)
    assert committed(ctx) == 32


class Killed(BaseException):
    """The processor dies here: nothing after this point of it runs."""


class KillingLog:
    """The test's log, except that once ``armed``, the stream processor dies at its next commit -
    of a transaction, or of its consumer group's offsets - after its outputs were sent. A killed
    transactional producer is left as a dead process leaves it: open, never closed. With
    ``abort``, the log aborts that one transaction instead, as when a rebalance took partitions."""

    def __init__(self, log: Log, group: str, abort: bool = False) -> None:
        self.log = log
        self.group = group
        self.abort = abort
        self.armed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)

    def kill_if_armed(self) -> None:
        if self.armed:
            raise Killed("killed after sending the poll's outputs, before committing")

    def transactional_producer(self, transactional_id: str, timeout_s: float | None = None) -> TransactionalProducer:
        return KilledTransactions(self, self.log.transactional_producer(transactional_id, timeout_s))

    def consumer(self, group_id: str | None = None, **options: object):
        consumer = self.log.consumer(group_id, **options)
        if group_id == self.group:
            commit = consumer.commit

            def killing_commit(offsets=None) -> None:
                self.kill_if_armed()
                commit(offsets)

            consumer.commit = killing_commit
        return consumer


class KilledTransactions:
    def __init__(self, log: KillingLog, producer: TransactionalProducer) -> None:
        self.log = log
        self.producer = producer
        self.killed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.producer, name)

    def commit(self, timeout: float = 30.0) -> None:
        if self.log.armed and self.log.abort:
            self.log.armed = False
            self.producer.abort(timeout)
            raise TransactionAbortedError("aborted by the test")
        self.killed = self.log.armed
        self.log.kill_if_armed()
        self.producer.commit(timeout)

    def close(self) -> None:
        if not self.killed:
            self.producer.close()


def test_a_processor_killed_between_sending_and_committing_emits_each_group_once_after_restart(make_ctx) -> None:
    ctx = make_ctx()
    log = ctx.log
    killing = ctx.log = KillingLog(log, f"{ctx.config.run}.stream.main")
    try:
        write(ctx, [(f"a{g}", i, float(i)) for g in range(3) for i in range(2)])
        with running(NativeStreamProcessor(ctx, "main")) as failures:
            wait_for(lambda: committed(ctx) == 6, "the first poll's commit", failures)
            killing.armed = True
            write(ctx, [(f"b{g}", i, float(i)) for g in range(3) for i in range(2)])
            wait_for(lambda: bool(failures), "the kill", failures=[])
        assert isinstance(failures[0], Killed)
    finally:
        ctx.log = log
    with running(NativeStreamProcessor(ctx, "main")) as failures:  # fences the killed one's open transaction
        wait_for(lambda: committed(ctx) == 12, "the restarted processor's commit", failures)
    samples = Counter(sample.sample_id for sample in visible(ctx, ctx.topics.samples("main"), TrainSample))
    groups = [f"{batch}{g}" for batch in "ab" for g in range(3)]
    assert samples == Counter(f"{group}/{index}" for group in groups for index in range(2))
    assert reported(ctx) == Counter(groups)


def test_a_transaction_the_log_aborts_takes_the_processor_back_to_its_last_commit(make_ctx) -> None:
    ctx = make_ctx()
    aborting = ctx.log = KillingLog(ctx.log, f"{ctx.config.run}.stream.main", abort=True)
    write(ctx, [(f"a{g}", i, float(i)) for g in range(3) for i in range(2)] + [("b0", 0, 1.0)])
    with running(NativeStreamProcessor(ctx, "main")) as failures:
        wait_for(lambda: committed(ctx) == 7, "the first poll's commit", failures)
        aborting.armed = True  # b0's first member is in the changelog now, b0's second in the aborted poll
        write(ctx, [("b0", 1, 0.0)] + [(f"b{g}", i, float(i)) for g in (1, 2) for i in range(2)])
        wait_for(lambda: committed(ctx) == 12, "the commit after the rewind", failures)
    ctx.log = aborting.log
    samples = Counter(sample.sample_id for sample in visible(ctx, ctx.topics.samples("main"), TrainSample))
    groups = [f"{batch}{g}" for batch in "ab" for g in range(3)]
    assert samples == Counter(f"{group}/{index}" for group in groups for index in range(2))
    assert reported(ctx) == Counter(groups)
    ctx.producer.flush()
    rewinds = [m.value for m in visible(ctx, ctx.topics.metrics(ctx.role), Metric) if m.name == STREAM_REWINDS]
    assert rewinds == [1.0]


STATEFUL = [
    {"op": "staleness"},
    {"op": "reward_norm"},
    {"op": "reinforce_pp", "window": 6},
    {"op": "zero_variance"},
    {"op": "replay", "ratio": 0.5, "capacity": 3, "selector": "uniform", "seed": 7},
    {"op": "fifo"},
]


def stateful_input() -> tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]]:
    """16 groups with varied rewards (g5's all equal), in two halves that split g8."""
    members = [(f"g{g}", i, 1.0 if g == 5 else float((3 * g + 5 * i) % 7)) for g in range(16) for i in range(2)]
    return members[:17], members[17:]


def test_a_restarted_processor_emits_what_an_uninterrupted_one_would(make_ctx) -> None:
    first, second = stateful_input()
    outputs = []
    for name, restart in [("whole", False), ("restarted", True)]:
        ctx = make_ctx(name, STATEFUL)
        write(ctx, first)
        with running(NativeStreamProcessor(ctx, "main")) as failures:
            wait_for(lambda: len(reported(ctx)) == 8, "the first half's feedback", failures)
            if not restart:
                write(ctx, second)
                wait_for(lambda: len(reported(ctx)) == 16, "all feedback", failures)
        if restart:
            write(ctx, second)
            with running(NativeStreamProcessor(ctx, "main")) as failures:
                wait_for(lambda: len(reported(ctx)) == 16, "all feedback", failures)
        samples = visible(ctx, ctx.topics.samples("main"), TrainSample)
        outputs.append([(s.sample_id, s.advantage, s.replayed) for s in samples])
    whole, restarted = outputs
    assert any(replayed for _, _, replayed in whole) and len({a for _, a, _ in whole}) > 4
    assert restarted == whole


def test_a_copy_further_apart_than_any_id_window_is_never_trained_twice(make_ctx, monkeypatch) -> None:
    """Exactly once by construction, not by id memories: with every memory of ids cut to one (the
    stream's completed groups, the changelog's window of closed ids, the trainer's taken samples),
    a processor that sees the issue's split group, is killed between sending and committing, and
    restarts, still hands the trainer each sample once - where the memories once were what dropped
    the copies a restart re-emitted, and copies further apart than them were trained twice."""
    monkeypatch.setattr(changelog, "CLOSED_SLOTS", 1)
    monkeypatch.setattr(GroupBuffer.__init__, "__defaults__", (1, False))
    ctx = make_ctx()
    log = ctx.log
    killing = ctx.log = KillingLog(log, f"{ctx.config.run}.stream.main")
    later = [("H", 1, 0.0)] + [(f"k{g}", i, float(i)) for g in range(20) for i in range(2)]
    try:
        write(ctx, split_input())
        with running(NativeStreamProcessor(ctx, "main")) as failures:
            wait_for(lambda: committed(ctx) == 31, "the split group's commit", failures)
            killing.armed = True
            write(ctx, later)
            wait_for(lambda: bool(failures), "the kill", failures=[])
        assert isinstance(failures[0], Killed)
    finally:
        ctx.log = log
    with running(NativeStreamProcessor(ctx, "main")) as failures:
        wait_for(lambda: committed(ctx) == 31 + len(later), "the restarted processor's commit", failures)

    topic = ctx.topics.samples("main")
    assembler = BatchAssembler(batch_samples=4, group_size=2, remember=1)
    for message in read_range(ctx.log, topic, 0, 0, ctx.log.end_offsets(topic).get(0, 0)):
        assembler.add(ctx.codec.decode(message.value, expect=TrainSample), message)
    trained: Counter[str] = Counter()
    while (batch := assembler.take()) is not None:
        trained.update(sample.sample_id for sample, _ in batch if sample is not None)
    groups = ["G", "H"] + [f"f{g}" for g in range(14)] + [f"k{g}" for g in range(20)]
    assert assembler.duplicates == 0
    assert trained == Counter(f"{group}/{index}" for group in groups for index in range(2))
