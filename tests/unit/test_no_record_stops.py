"""No record stops a component (issue #20): what raises while one record or group is handled is
dead-lettered with the exception's type and text, and the component goes on.

Bad record *contents* are injected into running processes in ``tests/integration/test_bad_records.py``;
here are the failures of the code that handles them - an operator, a mixer, the optimizer step, a
dataset row, a task - which a record cannot provoke on purpose.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import parse_config
from astraflow.core.errors import NonFiniteStepError
from astraflow.log import Message
from astraflow.producers.feeder.component import TaskFeeder
from astraflow.producers.rollout.component import task_problem
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, PromptStats, RolloutTask, TrainSample
from astraflow.streams.runtimes.native import NativeStreamProcessor
from astraflow.tasks.base import Problem
from astraflow.training.backends.torch_adamw import TorchBackend
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer
from tests.unit.test_bad_input import read
from tests.unit.test_stream_operators import traj


class Raising:
    name = "raising"

    def __call__(self, group, trainer_version):
        raise ZeroDivisionError("float division by zero")

    def mix(self, group):
        raise KeyError("replay slot")


@pytest.fixture
def ctx(tmp_path: Path):
    config = parse_config({"rollout": {"group_size": 2}, "log": {"partitions": 1}, "stream": {"max_staleness": 10}})
    context = ComponentContext(config, tmp_path, "stream")
    yield context
    context.close()


def feed_group(processor: NativeStreamProcessor, group: str, start: int) -> None:
    """Two members of ``group`` (rewards 1, 0) through the processor as one poll would, in its transaction."""
    topic = processor.ctx.topics.trajectories("main")
    processor.transactions.begin()
    accepted = []
    for index in range(2):
        value = Codec().encode(traj(group, index, float(1 - index), size=2))
        done = processor._add(Message(topic, 0, start + index, group.encode(), value, 0))
        if done is not None and processor._process(done, 0):
            accepted.append(done)
    processor._emit(accepted, 0)
    processor.transactions.commit()


@pytest.mark.parametrize("stage", ["operator", "mixer"])
def test_a_stage_that_raises_dead_letters_the_group_and_the_processor_goes_on(
    ctx: ComponentContext, stage: str
) -> None:
    processor = NativeStreamProcessor(ctx, "main")
    stages = processor.pipeline.operators if stage == "operator" else processor.pipeline.mixers
    stages.append(Raising())
    feed_group(processor, "bad", 0)
    stages.pop()
    feed_group(processor, "good", 2)
    ctx.producer.flush()
    letters = read(ctx, ctx.topics.deadletter(ctx.role), DeadLetter)
    samples = read(ctx, ctx.topics.samples("main"), TrainSample)
    stats = read(ctx, ctx.topics.feedback(), PromptStats)
    error = {"operator": "ZeroDivisionError: float division by zero", "mixer": "KeyError: 'replay slot'"}[stage]
    assert [(letter.offset, letter.error_type) for letter in letters] == [
        (0, error.split(":")[0]),
        (1, error.split(":")[0]),
    ]
    assert all(letter.reason.startswith(f"error: {error} (trajectory bad/") for letter in letters)
    assert [Codec().decode(letter.payload).trajectory_id for letter in letters] == ["bad/0", "bad/1"]
    assert sorted(s.sample_id for s in samples) == ["good/0", "good/1"]
    if stage == "operator":  # dropped before the feedback: reported as dropped
        assert [(s.group_id, s.accepted, s.drop_reason.split(":")[0]) for s in stats] == [
            ("bad", False, "error"),
            ("good", True, ""),
        ]
    assert processor.drops == {"error" if stage == "operator" else "emit_error": 1}


def test_a_non_finite_loss_skips_the_step_and_changes_nothing() -> None:
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, PolicyStepConfig(lr=0.1))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    def example(advantage: float) -> PolicyExample:
        return PolicyExample(
            np.array([5, 6], dtype=np.int32),
            np.array([7, 8, 1], dtype=np.int32),
            np.full(3, -2.0, dtype=np.float32),
            np.ones(3, dtype=np.uint8),
            advantage,
        )

    with pytest.raises(NonFiniteStepError, match="loss -inf is not finite"):
        trainer.step([example(3e38) for _ in range(4)])  # finite float32 advantages, an overflowing loss
    assert trainer.version == 0 and not trainer.optimizer.state
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    stats = trainer.step([example(1.0), example(-1.0)])  # and the next batch trains
    assert trainer.version == 1 and np.isfinite(stats.loss)


def test_the_torch_backend_leaves_weights_alone_on_a_non_finite_gradient() -> None:
    layer = torch.nn.Linear(2, 2)
    backend = TorchBackend(layer, lr=0.1, betas=(0.9, 0.99), weight_decay=0.0, max_grad_norm=1.0)
    before = layer.weight.detach().clone()
    layer(torch.ones(1, 2)).sum().backward()
    layer.weight.grad[0, 0] = float("nan")
    assert not np.isfinite(backend.step(0.1))
    assert torch.equal(layer.weight, before) and not backend.optimizer.state and layer.weight.grad is None


def test_a_row_too_large_for_a_task_is_dead_lettered_and_the_feeder_goes_on(ctx: ComponentContext) -> None:
    rows = [Problem("huge", "1+" * (9 * 1024 * 1024), "0")] + [
        Problem(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(3)
    ]
    feeder = TaskFeeder(ctx, rows, seed=0)
    stop = threading.Event()
    thread = threading.Thread(target=feeder.run, args=(stop,))
    thread.start()
    consumer = ctx.log.consumer(group_id="check")
    consumer.subscribe([ctx.topics.tasks()])
    tasks: list[RolloutTask] = []
    deadline = time.monotonic() + 60
    try:
        while len(tasks) < 3 and time.monotonic() < deadline and thread.is_alive():
            tasks += [Codec().decode(m.value, expect=RolloutTask) for m in consumer.poll(max_records=10, timeout=0.5)]
    finally:
        stop.set()
        thread.join(timeout=30)
        consumer.close()
    assert {t.prompt_id for t in tasks} == {"p0", "p1", "p2"}  # each epoch passes the huge row over
    letters = read(ctx, ctx.topics.deadletter(ctx.role), DeadLetter)
    assert letters and all("cannot be submitted: record of" in letter.reason for letter in letters)
    assert all("bytes exceeds the" in letter.reason for letter in letters)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"group_size": 0}, "group_size: 0 is not in 1..1024"),
        ({"group_size": 5000}, "group_size: 5000 is not in 1..1024"),
        ({"metadata": {"version.main": "three"}}, "metadata: version.main is 'three', not a version number"),
        ({"group_size": 3}, "group_size: 3, but the policy's rollout.group_size is 2"),
        ({}, None),
    ],
)
def test_a_task_the_producer_cannot_run_is_named(changes: dict, problem: str | None) -> None:
    fields = {"group_size": 2, "metadata": {"version.main": "3"}} | changes
    task = RolloutTask("t", "p", "t", "math", "1+1=", "2", fields["group_size"], 0, 0, fields["metadata"])
    assert task_problem(task, {"main": object()}, 2) == problem
