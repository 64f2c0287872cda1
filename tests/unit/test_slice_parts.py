"""The single-policy slice's plain parts: config errors, feeder capacity, batches, checkpoints."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from astraflow.config import load_config, parse_config
from astraflow.consumers.trainer.component import BatchAssembler
from astraflow.core.errors import ConfigError
from astraflow.log import Message
from astraflow.producers.feeder.component import TaskFeeder
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import TrainSample
from astraflow.tasks.base import Problem
from astraflow.training.checkpoint import CheckpointStore, TrainerState
from tests.unit.test_stream_operators import traj

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"


def test_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert config.log.backend == "embedded"


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"train": {"lrr": 0.1}}, "train.lrr"),
        ({"train": {"lr": -1}}, "train.lr"),
        ({"rollout": {"group_size": 0}}, "rollout.group_size"),
        ({"log": {"backend": "kafka"}}, "bootstrap is required"),
        ({"log": {"backend": "redis"}}, "log.backend"),
        ({"model": {"hidden": 130, "heads": 4}}, "heads (4) must divide hidden (130)"),
        ({"run": "bad name!"}, "run"),
    ],
)
def test_bad_config_names_the_field(raw: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        parse_config(raw)
    assert names in str(info.value)


def test_bad_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train: [unclosed")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)


@pytest.fixture
def ctx(tmp_path: Path):
    context = ComponentContext(
        parse_config({"rollout": {"group_size": 8}, "train": {"batch_samples": 256}, "stream": {"max_staleness": 2}}),
        tmp_path,
        "feed",
    )
    yield context
    context.close()


def test_feeder_capacity_and_deterministic_tasks(ctx: ComponentContext) -> None:
    rows = [Problem(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(5)]
    feeder = TaskFeeder(ctx, rows, seed=3)
    assert feeder.budgets["main"].tasks_per_batch == 32
    # (max_staleness + V + 1) * B, plus every dropped group
    assert feeder.capacity({"main": -1}, Counter()) == 3 * 32
    assert feeder.capacity({"main": 4}, Counter(main=7)) == 7 * 32 + 7
    first = [feeder.task(n, {"main": 0}).task_id for n in range(10)]
    again = [TaskFeeder(ctx, rows, seed=3).task(n, {"main": 0}).task_id for n in range(10)]
    assert first == again
    assert sorted(first[:5]) == [f"p{i}@0" for i in range(5)] and sorted(first[5:]) == [f"p{i}@1" for i in range(5)]


def sample(group: str, index: int, size: int) -> TrainSample:
    return TrainSample(f"{group}/{index}", traj(group, index, 1.0, size=size), 0.5, 2)


def message(offset: int) -> Message:
    return Message("t", 0, offset, None, b"", 0)


def test_batches_are_whole_groups_in_offset_order() -> None:
    assembler = BatchAssembler(batch_samples=4, group_size=2)
    stream = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 1), ("c", 0), ("c", 1)]
    for offset, (group, index) in enumerate(stream):
        assembler.add(sample(group, index, 2), message(offset))
    batch = assembler.take()
    assert [s.sample_id for s, _ in batch] == ["a/0", "b/0", "a/1", "b/1"]
    assert batch[-1][1].offset == 3
    assert assembler.duplicates == 1
    assert assembler.take() is None  # c is one group of 2 < 4 samples


def test_batch_waits_for_a_straddling_group() -> None:
    assembler = BatchAssembler(batch_samples=2, group_size=2)
    for offset, (group, index) in enumerate([("a", 0), ("b", 0), ("a", 1)]):
        assembler.add(sample(group, index, 2), message(offset))
    assert assembler.take() is None  # group b is open inside the prefix
    assembler.add(sample("b", 1, 2), message(3))
    batch = assembler.take()
    assert len(batch) == 4 and batch[-1][1].offset == 3


def test_a_dead_lettered_sample_still_completes_its_group() -> None:
    assembler = BatchAssembler(batch_samples=2, group_size=2)
    assembler.add(sample("a", 0, 2), message(0))
    assembler.fail(message(1), "a")  # a/1 was dead-lettered: the group is whole without it
    batch = assembler.take()
    assert [(s and s.sample_id, m.offset) for s, m in batch] == [("a/0", 0), (None, 1)]


def test_checkpoint_round_trip_and_atomicity(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    store = CheckpointStore(tmp_path, keep=2)
    for version in (1, 2, 3):
        store.save(model, optimizer, TrainerState(version, {0: 10 * version}, 4 * version))
        store.prune(lambda state: True)  # each version committed: retention keeps the newest two
    (tmp_path / "v00000009.tmp").mkdir()  # a crash mid-save leaves a .tmp directory
    assert [p.name for p in sorted(tmp_path.glob("v*"))] == ["v00000002", "v00000003", "v00000009.tmp"]
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    state = CheckpointStore(tmp_path).restore(fresh, fresh_opt)
    assert state == TrainerState(3, {0: 30}, 12)
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert not (tmp_path / "v00000009.tmp").exists()


def test_no_checkpoint_restores_nothing(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    assert CheckpointStore(tmp_path).restore(model, torch.optim.AdamW(model.parameters())) is None


def test_a_restarted_trainer_recalls_the_ids_it_trained_before_its_checkpoint(ctx: ComponentContext) -> None:
    from types import SimpleNamespace

    from astraflow.consumers.trainer.component import Trainer
    from astraflow.log import TopicPartition

    topic = ctx.topics.samples("main")
    ctx.topics.ensure(ctx.log, 1)
    for i in range(6):
        ctx.producer.send(topic, ctx.codec.encode(TrainSample(f"s{i}", traj("g", i % 2, 1.0), 1.0, 3)), partition=0)
    ctx.producer.flush()
    assembler = BatchAssembler(batch_samples=2, group_size=2)
    trainer = SimpleNamespace(ctx=ctx, offsets={0: 4})  # checkpointed: offsets 0..3 trained
    Trainer._recall_trained(trainer, [TopicPartition(topic, 0)], assembler, window=3)
    # offsets 1..3 are recalled (the window), 0 is outside it, 4 and 5 were never trained
    assert [assembler.remember(f"s{i}") for i in range(6)] == [True, False, False, False, True, True]
