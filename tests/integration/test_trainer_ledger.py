"""The trainer's versions and ledger on both backends: no version id names two weights, and a
second trainer of a policy fences the first.

Each test runs real trainers (a tiny model, real gradient steps) in this process on the embedded
log and on a real Kafka broker, feeding them recorded samples:

1. A trainer that checkpoints every 10 versions dies after publishing version 3, before any
   checkpoint. The next trainer restores nothing valid, so it starts from the base again - and
   publishes it as version 4, not 0, then trains the same samples again into 5-7. Every version id
   appears in exactly one manifest, version 4's full payload is the base's (version 0's), and the
   ledger holds both lineages: epoch 1's versions 0-3, epoch 2's start at 4 and steps 5-7, each
   step naming the samples and offset ranges it consumed.
2. A trainer that checkpoints every version trains version 1; a second trainer of the policy is
   created (which fences the first), and a new batch arrives. The first trainer takes it, steps,
   and exits with ``FencedError`` before it commits anything or touches its checkpoint
   directory; the second republishes the checkpointed version 1 and trains the batch as version 2.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from astraflow.consumers.trainer.component import Trainer
from astraflow.core.errors import FencedError
from astraflow.core.rundir import RunDir
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import LedgerEntry, OffsetRange, WeightChunk
from astraflow.weights.follow import WeightFollower
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import send_samples, stopping_at, tiny_math_config

BATCH = 64
WAIT_S = 120.0


@pytest.fixture
def make_ctx(log_target: dict[str, str], tmp_path: Path, unique: str) -> Iterator[Callable[[int], ComponentContext]]:
    """The context of a trainer of one run on the test's log, checkpointing every ``checkpoint_every``."""
    made: list[ComponentContext] = []

    def make(checkpoint_every: int) -> ComponentContext:
        config = tiny_math_config(
            tmp_path,
            {
                "run": f"ledger{unique}",
                "log": {"backend": log_target["backend"], "bootstrap": log_target.get("bootstrap")},
                "train": {"checkpoint_every": checkpoint_every, "batch_samples": BATCH},
            },
        )
        made.append(ComponentContext(config, tmp_path / "run", "train"))
        return made[-1]

    yield make
    for ctx in made:
        ctx.close()


def ledger(ctx: ComponentContext) -> list[LedgerEntry]:
    return [entry for _, entry in decode_snapshot(ctx.log, ctx.topics.ledger("main"))]


def manifests(ctx: ComponentContext) -> list[WeightChunk]:
    chunks = [chunk for _, chunk in decode_snapshot(ctx.log, ctx.topics.weights("main"))]
    return [chunk for chunk in chunks if chunk.kind == "manifest"]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_trainer_killed_between_publish_and_checkpoint_never_reuses_a_version_id(make_ctx) -> None:
    ctx = make_ctx(checkpoint_every=10)
    samples = recorded_samples(3 * BATCH)
    send_samples(ctx, samples)
    with pytest.raises(RuntimeError, match="killed"):
        stopping_at(Trainer(ctx, "main"), 3, threading.Event(), crash=True).run(threading.Event())
    assert not list(RunDir(ctx.run_dir).checkpoints("main").glob("v*"))  # none was due

    stop = threading.Event()
    stopping_at(Trainer(ctx, "main"), 7, stop).run(stop)

    published = manifests(ctx)
    assert [m.version for m in published] == list(range(8))  # each id once: 0-3, then 4-7
    assert published[4].encoding == published[0].encoding == "full"
    assert published[4].sha256 == published[0].sha256  # version 4 is the base again, under a new id
    entries = ledger(ctx)
    keys = [(e.epoch, e.kind, e.version, e.parent_epoch, e.parent_version) for e in entries]
    assert keys == [
        (1, "start", 0, -1, -1),
        (1, "step", 1, 1, 0),
        (1, "step", 2, 1, 1),
        (1, "step", 3, 1, 2),
        (2, "start", 4, -1, -1),
        (2, "step", 5, 2, 4),
        (2, "step", 6, 2, 5),
        (2, "step", 7, 2, 6),
    ]
    ids = [sample.sample_id for sample in samples]
    for entry in entries:
        if entry.kind == "step":
            batch = entry.version - (1 if entry.epoch == 1 else 5)  # epoch 2 trains batches 0-2 again
            assert entry.sample_ids == ids[batch * BATCH : (batch + 1) * BATCH]
            assert entry.ranges == [OffsetRange(0, batch * BATCH, (batch + 1) * BATCH)]
            assert entry.offsets == {"0": (batch + 1) * BATCH}
    assert [e.payload_sha256 for e in entries] == [m.sha256 for m in published]
    # a follower of the manifests alone that starts now sees the last one, commit markers after it or not
    follower = WeightFollower(ctx.log, ctx.topics.weights("main"), payload=False).start()
    try:
        assert follower.wait_caught_up(timeout=WAIT_S) and follower.latest_version == 7
    finally:
        follower.close()


def test_a_second_trainer_fences_the_first_which_exits_without_touching_its_checkpoints(make_ctx) -> None:
    ctx = make_ctx(checkpoint_every=1)
    samples = recorded_samples(2 * BATCH)
    send_samples(ctx, samples[:BATCH])
    first, failures, stop_first = Trainer(ctx, "main"), [], threading.Event()

    def run_first() -> None:
        try:
            first.run(stop_first)  # set only if the fencing failed to end it
        except BaseException as exc:  # the test looks at it below
            failures.append(exc)

    thread = threading.Thread(target=run_first, daemon=True)
    thread.start()
    try:
        wait_for(lambda: any(e.version == 1 for e in ledger(ctx)) or bool(failures), "the first trainer's version 1")
        checkpoints = RunDir(ctx.run_dir).checkpoints("main")
        before = {path: path.read_bytes() for path in sorted(checkpoints.rglob("*")) if path.is_file()}

        second = Trainer(ctx, "main")  # fences the first
        send_samples(ctx, samples[BATCH:])
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the fenced trainer did not exit"
    finally:
        stop_first.set()
        thread.join(WAIT_S)
    (failure,) = failures
    assert isinstance(failure, FencedError) and "was fenced" in str(failure) and "version 2" in str(failure)
    assert {path: path.read_bytes() for path in sorted(checkpoints.rglob("*")) if path.is_file()} == before
    assert [e.version for e in ledger(ctx)] == [0, 1]  # the fenced trainer's version 2 never became visible

    stop = threading.Event()
    stopping_at(second, 2, stop).run(stop)
    keys = [(e.epoch, e.kind, e.version, e.parent_epoch, e.parent_version) for e in ledger(ctx)]
    assert keys == [(1, "start", 0, -1, -1), (1, "step", 1, 1, 0), (2, "start", 1, 1, 1), (2, "step", 2, 2, 1)]
    assert ledger(ctx)[-1].sample_ids == [sample.sample_id for sample in samples[BATCH:]]
    assert [m.version for m in manifests(ctx)] == [0, 1, 1, 2]
