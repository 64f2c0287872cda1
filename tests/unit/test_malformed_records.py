"""Every malformed kind of ``astraflow/chaos/malformed.py`` through the reader that takes it in, in-process
(issue #52, item 3), and the fixes the kinds called for, each with a test of its own.

Each topic's kinds go through its reader once, in a module fixture, each kind as member 0 of a group of
its own whose other members are good: trajectories through the stream's ``NativeStreamProcessor._add``
and ``_process`` (with a weight follower at version 0, so that a future version shows); samples through
the checks of ``Trainer._admit`` (decode, ``sample_problem``, dead letter, ``BatchAssembler``), which
need no model; tasks through those of ``RolloutProducer._runnable``; feedback through the feeder's
``FeedbackReader``; metrics and dead letters through the launcher's ``RunMonitor`` and its
``ForgeryReporter``; schema records through a new ``LogSchemaStore``. Then per kind: rejected once, by a
reason naming its field, nothing raised, its group not left waiting; or, for an ``accept`` kind, taken
like a good record. A kind with a ``gap`` is expected to fail until the module it names is fixed
(strict xfail, so a fix shows).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astraflow.chaos.malformed import Kind, key_of, kinds, make
from astraflow.chaos.pipeline_runs import BATCH, GROUP, MAX_POSITIONS, PIPELINE, good_group, good_record
from astraflow.config import parse_config
from astraflow.consumers.trainer.batch_assembler import BatchAssembler
from astraflow.consumers.trainer.sample_checks import sample_problem
from astraflow.core.errors import AstraFlowError, SchemaError
from astraflow.infra.launch.launcher import ForgeryReporter
from astraflow.infra.launch.monitor import RunMonitor
from astraflow.log import Message, open_log
from astraflow.producers.feeder.feedback import FeedbackReader
from astraflow.producers.rollout.component import runnable_task, task_problem
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext, dead_letter_record
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, Metric, PromptStats, RolloutTask, TrainSample, Trajectory
from astraflow.schemas.store import SCHEMA_TOPIC, writer_schema
from astraflow.schemas.validation import (
    Limits,
    feedback_problem,
    letter_problem,
    metric_problem,
    validate,
)
from astraflow.streams.runtimes.native import NativeStreamProcessor
from tests.unit.test_stale_samples import Recording

RUN = "fuzz"
CONFIG = {
    "run": RUN,
    "rollout": {"group_size": GROUP},
    "log": {"partitions": 1},
    "train": {"batch_samples": BATCH},
    "stream": {"max_staleness": 1000, "pipeline": PIPELINE},
}
VOCAB = 27
TRAINER_LIMITS = Limits(group_size=None, vocab_size=VOCAB, context_length=MAX_POSITIONS)
"""What ``Trainer.__init__`` makes of the tiny model (the group size it checks apart)."""


@dataclasses.dataclass
class Outcome:
    """What a reader did with the record of one kind."""

    reasons: list[str] = dataclasses.field(default_factory=list)
    """Why it was rejected: dead letters of it, notes, the schema store's ``rejected``."""
    taken: bool = False
    """Taken as good: trained, observed, believed, learnt."""
    waiting: bool = False
    """Its group was left waiting for a member that never comes."""
    error: str = ""
    """What the reader raised."""


def params(topic: str) -> list:
    return [
        pytest.param(kind, id=kind.name, marks=[pytest.mark.xfail(strict=True, reason=kind.gap)] if kind.gap else [])
        for kind in kinds(topic)
    ]


def check(kind: Kind, outcome: Outcome) -> None:
    assert not outcome.error, f"the reader raised {outcome.error}"
    assert not outcome.waiting, "its group was left waiting"
    if kind.verdict == "accept":
        assert outcome.reasons == [] and outcome.taken, outcome
        return
    assert len(outcome.reasons) == 1, outcome.reasons
    reason = dead_letter_record("test", None, outcome.reasons[0]).reason  # as written: cut to REASON_CHARS
    assert kind.field in reason, reason[:500]
    assert not outcome.taken


def run_directory(factory: pytest.TempPathFactory) -> Path:
    """A run directory whose base checkpoint says what the tiny model's says (vocabulary, context)."""
    run_dir = factory.mktemp("run")
    (run_dir / "base").mkdir()
    (run_dir / "base" / "config.json").write_text(json.dumps({"vocab_size": VOCAB, "max_position_embeddings": 64}))
    return run_dir


def letters_by_offset(ctx: ComponentContext, role: str) -> dict[int, list[str]]:
    ctx.producer.flush()
    found: dict[int, list[str]] = {}
    for _, letter in decode_snapshot(ctx.log, ctx.topics.deadletter(role)):
        found.setdefault(letter.offset, []).append(letter.reason)
    return found


def attempt(outcomes: dict[str, Outcome], kind: Kind, run: Callable[[], Outcome]) -> None:
    try:
        outcomes[kind.name] = run()
    except Exception as exc:  # noqa: BLE001 - what the reader raised is the finding
        outcomes[kind.name] = Outcome(error=f"{type(exc).__name__}: {str(exc)[:300]}")


# --- trajectories: the stream processor -------------------------------------------------------------


class Follower:
    """The trainer's weights as the stream sees them: version 0 published, nothing newer coming."""

    latest_version = newest_version = 0

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        return False

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def stream_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    ctx = ComponentContext(parse_config(CONFIG), run_directory(tmp_path_factory), "stream")
    outcomes: dict[str, Outcome] = {}
    try:
        processor = NativeStreamProcessor(ctx, "main")
        processor.follower = Follower()
        topic = ctx.topics.trajectories("main")
        processor.transactions.begin()
        offsets = iter(range(10**6))
        positions: dict[str, list[int]] = {}

        def run(kind: Kind, gid: str) -> Outcome:
            members = good_group("trajectories", gid, RUN)
            value = make(kind, members[0], 0, ctx.codec)
            values = [value] + [ctx.codec.encode(member) for member in members[1:]]
            key = key_of(kind, members[0], value)
            accepted = None
            positions[kind.name] = []
            for value in values:
                positions[kind.name].append(next(offsets))
                group = processor._add(Message(topic, 0, positions[kind.name][-1], key, value, 1000))
                if group is not None:
                    accepted = processor._process(group, 0)
            buffer = processor.states[0].buffer
            return Outcome(taken=accepted is True, waiting=bool(buffer.pending or buffer.failed))

        for index, kind in enumerate(kinds("trajectories")):
            attempt(outcomes, kind, lambda: run(kind, f"k{index}"))
        processor.transactions.commit()
        letters = letters_by_offset(ctx, "stream")
    finally:
        ctx.close()
    for name, group in positions.items():
        outcomes[name].reasons = [reason for offset in group for reason in letters.get(offset, [])]
    return outcomes


@pytest.mark.parametrize("kind", params("trajectories"))
def test_the_stream_processor_rejects_each_malformed_trajectory(kind: Kind, stream_outcomes: dict) -> None:
    check(kind, stream_outcomes[kind.name])


# --- samples: the trainer's checks --------------------------------------------------------------------


def trainer_admit(ctx: ComponentContext, assembler: BatchAssembler, message: Message) -> None:
    """What ``Trainer`` does with each samples record (``BatchAssembler.admit``), without its model."""
    assembler.admit(message, ctx.codec, lambda sample: sample_problem(sample, TRAINER_LIMITS, GROUP), ctx.dead_letter)


@pytest.fixture(scope="module")
def sample_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    ctx = ComponentContext(parse_config(CONFIG), run_directory(tmp_path_factory), "train")
    outcomes: dict[str, Outcome] = {}
    topic = ctx.topics.samples("main")
    try:

        def run(kind: Kind, index: int) -> Outcome:
            members = good_group("samples", f"k{index}", RUN)
            value = make(kind, members[0], 0, ctx.codec)
            values = [value] + [ctx.codec.encode(member) for member in members[1:]]
            key = key_of(kind, members[0], value)
            assembler = BatchAssembler(GROUP, GROUP)  # a batch per whole group: a group left waiting shows
            for offset, value in enumerate(values, start=index * GROUP):
                trainer_admit(ctx, assembler, Message(topic, 0, offset, key, value, 0))
            batch = assembler.take()
            taken = batch is not None and any(s is not None and m.offset == index * GROUP for s, m in batch)
            return Outcome(taken=taken, waiting=batch is None)

        for index, kind in enumerate(kinds("samples")):
            attempt(outcomes, kind, lambda: run(kind, index))
        letters = letters_by_offset(ctx, "trainer")
    finally:
        ctx.close()
    for index, kind in enumerate(kinds("samples")):
        outcomes[kind.name].reasons = [r for o in range(index * GROUP, (index + 1) * GROUP) for r in letters.get(o, [])]
    return outcomes


@pytest.mark.parametrize("kind", params("samples"))
def test_the_trainer_rejects_each_malformed_sample(kind: Kind, sample_outcomes: dict) -> None:
    check(kind, sample_outcomes[kind.name])


def test_rejected_samples_that_share_an_invalid_id_still_complete_their_group(tmp_path: Path) -> None:
    """Two members of a group whose sample ids are both empty: both are dead-lettered and counted towards
    the group, so it completes. (Taking the second for a copy of the first, as ``BatchAssembler.admit``
    once did, left the group - and every batch after it - waiting for ever.)"""
    ctx = ComponentContext(parse_config(CONFIG), tmp_path, "train")
    try:
        assembler = BatchAssembler(GROUP, GROUP)
        members = good_group("samples", "g", RUN)
        members[0] = dataclasses.replace(members[0], sample_id="")
        members[1] = dataclasses.replace(members[1], sample_id="")
        for offset, member in enumerate(members):
            trainer_admit(ctx, assembler, Message("samples", 0, offset, b"g", ctx.codec.encode(member), 0))
        assert assembler.take() is not None
    finally:
        ctx.close()


# --- tasks: a rollout producer's checks ---------------------------------------------------------------


@pytest.mark.parametrize("kind", params("tasks"))
def test_a_rollout_producer_rejects_each_malformed_task(kind: Kind) -> None:
    """``RolloutProducer._runnable`` (``runnable_task``: decode, ``task_problem``); a dead letter must encode."""
    codec = Codec()
    value = make(kind, good_record("tasks"), 0, codec)
    message = Message(f"{RUN}.tasks.math", 0, 0, b"g", value, 0)
    task, reason, error = runnable_task(codec, value, {"main": None}, GROUP)
    outcome = Outcome([reason] if task is None else [], taken=task is not None)
    if task is None:
        try:
            codec.encode(dead_letter_record("rollout-test", message, reason, error))
        except AstraFlowError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
    check(kind, outcome)


# --- feedback: the task feeder ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def feedback_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    ctx = ComponentContext(parse_config(CONFIG), run_directory(tmp_path_factory), "feed")
    outcomes: dict[str, Outcome] = {}
    curator = Recording()
    reader = FeedbackReader(ctx, curator)
    topic = ctx.topics.feedback()
    try:

        def run(kind: Kind, index: int) -> Outcome:
            good = good_record("feedback", f"k{index}", 0, RUN)
            value = make(kind, good, 0, ctx.codec)
            observed, dropped = len(curator.observed), reader.dropped["main"]
            reader._take([Message(topic, 0, index, key_of(kind, good, value), value, 0)])
            return Outcome(taken=len(curator.observed) > observed or reader.dropped["main"] > dropped)

        for index, kind in enumerate(kinds("feedback")):
            attempt(outcomes, kind, lambda: run(kind, index))
        letters = letters_by_offset(ctx, "feeder")
    finally:
        reader.close()
        ctx.close()
    for index, kind in enumerate(kinds("feedback")):
        outcomes[kind.name].reasons = letters.get(index, [])
    return outcomes


@pytest.mark.parametrize("kind", params("feedback"))
def test_the_feeder_rejects_each_malformed_feedback_record(kind: Kind, feedback_outcomes: dict) -> None:
    check(kind, feedback_outcomes[kind.name])


# --- metrics and dead letters: the launcher's monitor ---------------------------------------------------


class Feed:
    """The monitor's consumer, handing it one record at a time, so that what it did shows per record."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def poll(self, max_records: int = 500, timeout: float = 0.0) -> list[Message]:
        messages, self.messages = self.messages, []
        return messages

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def monitor_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    run_dir = run_directory(tmp_path_factory)
    launcher = ComponentContext(parse_config(CONFIG), run_dir, "launch")
    monitor = RunMonitor(launcher.config, run_dir, launcher.log, launcher.topics, report=ForgeryReporter(launcher))
    monitor.consumer.close()
    monitor.consumer = feed = Feed()
    monitor.tensorboard = None  # its writer is not what is tested, and is slow to take 10,000 labels
    outcomes: dict[str, Outcome] = {}
    try:

        def run(kind: Kind, index: int) -> Outcome:
            good = good_record(kind.topic, f"k{index}", index, RUN)
            value = make(kind, good, 0, launcher.codec)
            topic = (
                launcher.topics.metrics("stream") if kind.topic == "metrics" else launcher.topics.deadletter("stream")
            )
            monitor.notes.clear()
            written = monitor.out.tell()
            feed.messages = [Message(topic, 0, index, key_of(kind, good, value), value, 0)]
            monitor._consume(timeout=0.0)
            believed = monitor.out.tell() > written if kind.topic == "metrics" else not monitor.notes
            notes = [note for note in monitor.notes if not note.startswith("forged record ignored")]
            return Outcome(notes, taken=believed)

        for index, kind in enumerate([*kinds("metrics"), *kinds("deadletter")]):
            attempt(outcomes, kind, lambda: run(kind, index))
        forged = letters_by_offset(launcher, "admin")  # a forgery's reason as it lasts: the launcher's dead letter
    finally:
        monitor.close()
        launcher.close()
    for index, kind in enumerate([*kinds("metrics"), *kinds("deadletter")]):
        outcomes[kind.name].reasons += forged.get(index, [])
    return outcomes


@pytest.mark.parametrize("kind", params("metrics") + params("deadletter"))
def test_the_monitor_rejects_each_malformed_metric_and_dead_letter(kind: Kind, monitor_outcomes: dict) -> None:
    check(kind, monitor_outcomes[kind.name])


# --- schema records: every process's schema store -------------------------------------------------------


@pytest.fixture(scope="module")
def schema_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    path = tmp_path_factory.mktemp("schemas") / "log.sqlite"
    outcomes: dict[str, Outcome] = {}
    written: dict[str, tuple[int, bytes | None]] = {}
    with open_log("embedded", path=path) as log:
        LogSchemaStore(log).close()  # the packaged schemas first, as any process publishes them
        offset = sum(log.end_offsets(SCHEMA_TOPIC).values())
        with log.producer() as producer:
            for index, kind in enumerate(kinds("schemas")):
                good = good_record("schemas", f"k{index}")
                value = make(kind, good, 0)
                written[kind.name] = (offset, value)
                producer.send(SCHEMA_TOPIC, value, key=key_of(kind, good, value))
                offset += 1
            producer.flush()
        try:
            store = LogSchemaStore(log)
        except Exception as exc:  # noqa: BLE001 - what the store raised is the finding
            return {kind.name: Outcome(error=f"{type(exc).__name__}: {exc}") for kind in kinds("schemas")}
        with store:
            for kind in kinds("schemas"):
                at, value = written[kind.name]
                try:
                    learnt = writer_schema(value.decode()).fingerprint in store
                except Exception:  # noqa: BLE001 - no schema in the bytes: nothing to learn
                    learnt = False
                outcomes[kind.name] = Outcome([r for r in store.rejected if f"]@{at}:" in r], taken=learnt)
            assert Codec(store).decode(Codec().encode(good_record("metrics"))) == good_record("metrics")
    return outcomes


@pytest.mark.parametrize("kind", params("schemas"))
def test_every_schema_store_skips_each_malformed_schema_record(kind: Kind, schema_outcomes: dict) -> None:
    check(kind, schema_outcomes[kind.name])


def test_the_catalogue_has_thirty_kinds_and_more_of_every_topic_a_component_reads() -> None:
    rejected = kinds(verdict="reject")
    assert len(rejected) >= 30
    assert {kind.topic for kind in rejected} == {
        "trajectories", "samples", "tasks", "feedback", "metrics", "deadletter", "schemas",
    }  # fmt: skip
    kind = rejected[0]
    assert make(kind, good_record(kind.topic), 3) == make(kind, good_record(kind.topic), 3)


# --- the fixes, each on its own -----------------------------------------------------------------------


def trajectory(**changes: Any) -> Trajectory:
    return dataclasses.replace(good_record("trajectories"), **changes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"behaviour_logprobs": np.array([-1.0, 0.5, -1.0], np.float32)}, "behaviour_logprobs: 0.5 is above 0"),
        ({"behaviour_logprobs": np.array([-1.0, 1e-4, 0.0], np.float32)}, None),  # rounding, not a probability > 1
        ({"prompt_ids": np.zeros(0, np.int32)}, "prompt_ids: empty prompt"),
        ({"token_versions": np.array([0, -1, 0], np.int32)}, "token_versions: negative version -1"),
        ({"generate_ms": math.nan}, "generate_ms: nan is not a finite, non-negative duration"),
        ({"reward_ms": -1.0}, "reward_ms: -1.0 is not a finite, non-negative duration"),
        ({"trajectory_id": ""}, "trajectory_id: empty"),
        ({"group_id": "g\x1fh"}, "group_id: control character U+001F at 1"),
        ({"prompt_id": "p\0"}, "prompt_id: control character U+0000 at 1"),
        ({"finish_reason": "", "producer_id": "", "trajectory_id": "τ/😀"}, None),  # labels may be empty, ids unicode
    ],
)
def test_a_trajectory_is_checked_for_what_the_fuzzer_found(changes: dict, reason: str | None) -> None:
    problem = validate(trajectory(**changes), Limits(group_size=GROUP, vocab_size=VOCAB))
    assert problem == reason if reason is None else problem.startswith(reason), problem


@pytest.mark.parametrize(("sample_id", "reason"), [("", "sample_id: empty"), ("g/0\0", "sample_id: control character")])
def test_a_sample_id_must_be_an_id(sample_id: str, reason: str) -> None:
    sample = dataclasses.replace(good_record("samples"), sample_id=sample_id)
    assert sample_problem(sample, TRAINER_LIMITS, GROUP).startswith(reason)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"pass_rate": math.nan}, "pass_rate: nan is not a finite value in [0, 1]"),
        ({"pass_rate": 1.5}, "pass_rate: 1.5"),
        ({"reward_std": -0.5}, "reward_std: -0.5"),
        ({"mean_reward": 2e6}, "mean_reward: 2000000.0 is not a finite value in [-1e+06, 1e+06]"),
        ({"policy": "ghost"}, "policy: 'ghost' is not a policy of this run (main)"),
        ({"num_samples": 0}, "num_samples: 0"),
        ({"version": -1}, "version: negative version -1"),
        ({"trajectory_ids": ["g/0"]}, "trajectory_ids: 1 ids for 4 samples"),
        ({"trajectory_ids": []}, None),  # written before feedback named its trajectories
        ({"trajectory_ids": ["g/0", "", "g/2", "g/3"]}, "trajectory_ids: id 1: empty"),
    ],
)
def test_feedback_is_checked_field_by_field(changes: dict, reason: str | None) -> None:
    problem = feedback_problem(dataclasses.replace(good_record("feedback"), **changes), ("main",), 1e6)
    assert problem == reason if reason is None else problem.startswith(reason), problem


def test_the_feeder_neither_counts_nor_observes_invalid_feedback(tmp_path: Path) -> None:
    """A dropped group's record gives a task back and feeds the curator: an invalid one does neither."""
    ctx = ComponentContext(parse_config(CONFIG), tmp_path, "feed")
    curator = Recording()
    reader = FeedbackReader(ctx, curator)
    topic = ctx.topics.feedback()
    bad = dataclasses.replace(good_record("feedback", "bad"), pass_rate=math.nan)
    try:
        messages = [ctx.codec.encode(bad), ctx.codec.encode(good_record("feedback", "good"))]
        reader._take([Message(topic, 0, offset, b"p", value, 0) for offset, value in enumerate(messages)])
        letters = letters_by_offset(ctx, "feeder")
    finally:
        reader.close()
        ctx.close()
    assert curator.observed == ["good"] and reader.dropped["main"] == 1 and reader.rejected == 1
    assert letters[0][0].startswith("invalid feedback of group bad: pass_rate: nan")


def test_undecodable_bytes_name_the_field_they_break_at() -> None:
    codec = Codec()
    good = codec.encode(good_record("trajectories"))
    with pytest.raises(SchemaError, match="a fingerprint of 3 of 8 bytes"):
        codec.decode(good[:5])
    with pytest.raises(SchemaError, match="corrupt or truncated .* at field trajectory_id: EOFError"):
        codec.decode(good[:12])
    not_utf8 = make("trajectories.prompt_id.not_utf8", good_record("trajectories"), 0, codec)
    with pytest.raises(SchemaError, match="at field prompt_id: UnicodeDecodeError"):
        codec.decode(not_utf8)
    incompatible = make("trajectories.reward.as_string", good_record("trajectories"), 0, codec)
    with pytest.raises(SchemaError, match="incompatible .* at field reward: its writer schema does not resolve"):
        codec.decode(incompatible)
    with pytest.raises(SchemaError, match="value: a tombstone"):  # as the faust runtime hands one over
        codec.decode(None)  # type: ignore[arg-type]


def test_no_record_of_the_schema_topic_stops_a_schema_store(tmp_path: Path) -> None:
    """Every process reads the whole schema topic at start: bytes that are not UTF-8, JSON nested deeper
    than Python recurses (which raised RecursionError out of every process's start) or a key that is not
    the schema's fingerprint is skipped with its reason, and the store works."""
    deep = make("schemas.schema.nested_too_deep", "", 0).decode()
    good = good_record("schemas", "fine")
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        LogSchemaStore(log).close()  # the topic, and the packaged schemas on it
        with log.producer() as producer:
            producer.send(SCHEMA_TOPIC, b"\xff", key=b"a")
            producer.send(SCHEMA_TOPIC, deep.encode(), key=b"b")
            producer.send(SCHEMA_TOPIC, good.encode(), key=b"0" * 16)
            producer.flush()
        with LogSchemaStore(log) as store:
            assert [reason.split(": ")[1] for reason in store.rejected] == ["value", "schema", "key"]
            assert "RecursionError" in store.rejected[1]
            assert writer_schema(good).fingerprint not in store
            assert Codec(store).decode(Codec().encode(good_record("metrics"))) == good_record("metrics")


def test_a_member_rejected_for_its_group_id_completes_the_group_its_key_names(tmp_path: Path) -> None:
    """Its siblings' group completes at once (dropped as incomplete) instead of waiting for
    ``stream.group_timeout_s`` for a member that went to a group of its own."""
    ctx = ComponentContext(parse_config(CONFIG), tmp_path, "stream")
    try:
        processor = NativeStreamProcessor(ctx, "main")
        topic = ctx.topics.trajectories("main")
        members = good_group("trajectories", "g", RUN)
        members[0] = dataclasses.replace(members[0], group_id="", trajectory_id="")
        processor.transactions.begin()
        groups = [processor._add(Message(topic, 0, i, b"g", ctx.codec.encode(m), 0)) for i, m in enumerate(members)]
        processor.transactions.abort()
    finally:
        ctx.close()
    assert groups[:3] == [None, None, None] and groups[3].failed == ["0@0"]
    assert [t.trajectory_id for t in groups[3].trajectories] == ["g/1", "g/2", "g/3"]


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (Metric("stream", "stream.group_reward", math.nan, 0, 0), "value: non-finite nan"),
        (Metric("stream", "", 1.0, 0, 0), "name: empty"),
        (Metric("stream", "stream.x\0", 1.0, 0, 0), "name: control character U+0000"),
        (Metric("stream", "stream.x", 1.0, 0, 0, {str(i): "" for i in range(65)}), "labels: 65 labels"),
        (Metric("stream", "stream.x", 1e300, 0, 0, {"reason": "x" * 4000}), None),
    ],
)
def test_a_metric_is_checked_whoever_writes_it(record: Metric, reason: str | None) -> None:
    problem = metric_problem(record)
    assert problem == reason if reason is None else problem.startswith(reason), problem


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"origin": ""}, "origin: empty"),
        ({"reason": ""}, "reason: empty"),
        ({"offset": -7}, "offset: -7 is no position"),
        ({"topic": "", "partition": 0, "offset": 5}, "topic: none, but a position 0@5"),
        ({"partition": -1, "offset": -1}, None),  # a record re-encoded by the stream
        ({"topic": "", "partition": -1, "offset": -1}, None),  # the fate of no record
    ],
)
def test_a_dead_letter_is_checked_whoever_writes_it(changes: dict, reason: str | None) -> None:
    problem = letter_problem(dataclasses.replace(good_record("deadletter"), **changes))
    assert problem == reason if reason is None else problem.startswith(reason), problem


# --- seeded random variation: what no kind above spells out ---------------------------------------------

CHECKS: dict[type, Callable[[Any], str | None]] = {
    Trajectory: lambda record: validate(record, Limits(1e6, GROUP, VOCAB, MAX_POSITIONS), 0),
    TrainSample: lambda record: sample_problem(record, TRAINER_LIMITS, GROUP),
    RolloutTask: lambda record: task_problem(record, {"main": None}, GROUP),
    PromptStats: lambda record: feedback_problem(record, ("main",), 1e6),
    Metric: metric_problem,
    DeadLetter: letter_problem,
}
TOPIC_OF = {Trajectory: "trajectories", TrainSample: "samples", RolloutTask: "tasks", PromptStats: "feedback"}
TOPIC_OF.update({Metric: "metrics", DeadLetter: "deadletter"})
POOL: dict[type, list[Any]] = {
    float: [math.nan, math.inf, -math.inf, 1e300, -1e300, 5e-324, -0.0, 0.5],
    int: [-(2**63), -(2**31), -1, 0, 1, 5, 2**31 - 1, 2**63 - 1],
    str: ["", "\0", "\x1f", "x" * 300, "τ😀", "main", "g/0"],
}


def mutated(rng: random.Random, record: Any) -> Any:
    """``record`` with one to three fields set to an edge value of their type (arrays: resized or poked)."""
    names = [f.name for f in dataclasses.fields(record)]
    for name in rng.sample(names, rng.randint(1, 3)):
        value = getattr(record, name)
        if isinstance(value, np.ndarray):
            size = rng.choice([0, max(len(value) - 1, 0), len(value) + 1]) if rng.random() < 0.5 else len(value)
            value = np.resize(value, size)
            if len(value) and value.dtype.kind == "f":
                with np.errstate(over="ignore"):
                    value[rng.randrange(len(value))] = rng.choice(POOL[float])
            elif len(value):
                info = np.iinfo(value.dtype)
                value[rng.randrange(len(value))] = min(max(rng.choice(POOL[int]), info.min), info.max)
        elif type(value) in POOL:
            value = rng.choice(POOL[type(value)])
        record = dataclasses.replace(record, **{name: value})
    return record


@pytest.mark.parametrize("kind", list(CHECKS), ids=lambda kind: kind.__name__)
def test_edge_values_in_any_field_are_named_by_the_check_or_harmless(kind: type) -> None:
    """Seeded variation (hypothesis is not a dependency): 300 records of one to three edge values each,
    written and read back like any record; a check never raises, and a reason names a field of the record."""
    rng, codec = random.Random(f"edges/{kind.__name__}"), Codec()
    fields_ = {f.name for f in dataclasses.fields(kind)} | {f.name for f in dataclasses.fields(Trajectory)}
    fields_ |= {"prompt_ids + response_ids"}
    for _ in range(300):
        record = mutated(rng, good_record(TOPIC_OF[kind]))
        try:
            record = codec.decode(codec.encode(record), expect=kind)
        except SchemaError:
            continue  # a value its Avro type cannot hold never reaches a reader
        problem = CHECKS[kind](record)
        assert problem is None or problem.split(":", 1)[0] in fields_, problem


@pytest.mark.parametrize("kind", list(CHECKS), ids=lambda kind: kind.__name__)
def test_corrupt_bytes_only_ever_raise_schema_error_and_never_a_check(kind: type) -> None:
    """Seeded corruption of each record's bytes (bytes set, cut, inserted): decoding raises ``SchemaError``
    or gives a record its check takes without raising."""
    rng, codec = random.Random(f"bytes/{kind.__name__}"), Codec()
    data = codec.encode(good_record(TOPIC_OF[kind]))
    for _ in range(300):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(corrupt))
            action = rng.random()
            if action < 0.6:
                corrupt[at] = rng.randrange(256)
            elif action < 0.8:
                del corrupt[at]
            else:
                corrupt.insert(at, rng.randrange(256))
        try:
            record = codec.decode(bytes(corrupt), expect=kind)
        except SchemaError:
            continue
        CHECKS[kind](record)
