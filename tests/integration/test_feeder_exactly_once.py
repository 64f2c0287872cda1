"""The task feeder writes each submission round in one transaction (issue #21), on both backends.

A feeder that dies after sending a round's tasks, before committing them, leaves none of them
visible; restarted, it submits exactly the tasks an uninterrupted feeder submits on the same
feedback, the GRESO curator's random decisions included.
"""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.log import TopicPartition
from astraflow.producers.feeder.component import TaskFeeder
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import PromptStats, RolloutTask
from astraflow.tasks.base import Problem
from tests.integration.crashes import Death, DyingLog, Killed, context, read_all, running, wait_for

ROWS = [Problem(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(10)]
ROUND = 4
"""Tasks in one trainer batch (4 groups of 2 samples), all a feeder may submit before version 0."""
RAW = {
    "rollout": {"group_size": 2},
    "train": {"batch_samples": 8},
    "stream": {"max_staleness": 0, "curator": {"type": "greso", "adapt_every": 100_000, "seed": 5}},
}


def hard(prompt: str) -> PromptStats:
    """An all-wrong group: GRESO submits the prompt again with probability p_hard (0.5)."""
    return PromptStats(prompt, f"{prompt}@0", "math", "main", 0, 2, 0.0, 0.0, 0.0)


def dropped(group: int) -> PromptStats:
    """A group the stream processor dropped: the feeder may submit one more task (once per group)."""
    return PromptStats("gone", f"gone@{group}", "math", "main", 0, 2, 0.5, 0.5, 0.5, accepted=False)


def write_feedback(ctx: ComponentContext, records: list[PromptStats]) -> None:
    with ctx.log.producer() as producer:
        for stats in records:
            producer.send(ctx.topics.feedback(), ctx.codec.encode(stats), key=stats.prompt_id.encode())
        producer.flush()


def read_tasks(ctx: ComponentContext, count: int) -> list[RolloutTask]:
    """The first ``count`` tasks a reader gets from the start of the tasks topic."""
    topic = ctx.topics.tasks()
    tasks: list[RolloutTask] = []

    def read() -> bool:
        tasks.extend(ctx.codec.decode(message.value) for message in reader.poll(timeout=0.2))
        return len(tasks) >= count

    with ctx.log.consumer() as reader:
        reader.assign([TopicPartition(topic, p) for p in ctx.log.end_offsets(topic)])
        wait_for(read, f"{count} tasks in {topic}")
    return tasks


def submitted(ctx: ComponentContext) -> list[tuple[str, int, str | None]]:
    """(task id, candidate index, submission number) of every committed task, in submission order."""
    tasks = read_all(ctx, ctx.topics.tasks())
    return sorted(((t.task_id, int(t.metadata["cursor"]), t.metadata.get("seq")) for t in tasks), key=lambda t: t[1])


def feed(ctx: ComponentContext, count: int) -> None:
    """Run a feeder until ``count`` tasks are visible, then stop it."""
    stop = threading.Event()
    with running(lambda: TaskFeeder(ctx, ROWS, seed=0).run(stop)) as raised:
        read_tasks(ctx, count)
        stop.set()
    assert raised == []


def test_a_feeder_killed_mid_round_shows_none_of_it_and_resumes_as_if_uninterrupted(
    log_target: dict[str, str], backend: str, tmp_path: Path, unique: str
) -> None:
    uninterrupted = context(log_target, tmp_path / "a", "feed", {**RAW, "run": f"fa{unique}"})
    ctx = context(log_target, tmp_path / "b", "feed", {**RAW, "run": f"fb{unique}"})
    try:
        write_feedback(
            uninterrupted, [hard(row.prompt_id) for row in ROWS] + [dropped(group) for group in range(ROUND)]
        )
        feed(uninterrupted, 2 * ROUND)
        expected = submitted(uninterrupted)

        write_feedback(ctx, [hard(row.prompt_id) for row in ROWS])
        log, death = ctx.log, Death()
        ctx.log = DyingLog(log, death, after=1)  # the second round's commit
        death.arm(ctx.producer, "flush", after=1)  # where a feeder without transactions ended its second round
        topic = ctx.topics.tasks()
        with running(lambda: TaskFeeder(ctx, ROWS, seed=0).run(threading.Event())) as raised:
            read_tasks(ctx, ROUND)
            first_round = sum(log.end_offsets(topic).values())
            write_feedback(ctx, [dropped(group) for group in range(ROUND)])  # room for a second round
        assert [type(exc) for exc in raised] == [Killed]
        ctx.producer.flush()  # what the dead feeder had queued reaches the log, as its delivery would have
        if backend == "embedded":  # the log writes a transaction only at its commit
            assert sum(log.end_offsets(topic).values()) == ROUND, "tasks of the killed round were written"
        else:  # they reached the broker, in a transaction left open
            wait_for(lambda: sum(log.end_offsets(topic).values()) > first_round, "the killed round on the broker")
        # fence the dead feeder as its restart will, by the id the feeder names: the round is aborted
        log.transactional_producer(f"fb{unique}.feed.math").close()
        assert len(read_all(ctx, topic)) == ROUND, "tasks of the killed round became visible"

        feed(ctx, 2 * ROUND)
        resumed = submitted(ctx)
    finally:
        uninterrupted.close()
        ctx.close()
    assert resumed == expected
    assert [seq for _, _, seq in expected] == [str(n) for n in range(2 * ROUND)]
    assert expected[-1][1] > 2 * ROUND, "the curator skipped some candidates"
