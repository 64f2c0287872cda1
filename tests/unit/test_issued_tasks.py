"""A trajectory is trained only as the answer to a task the feeder issued (``streams/runtimes/issued_tasks.py``):
with ``stream.verify_tasks`` the stream processor dead-letters one that names a task never issued, or
claims another prompt, prompt id, group, workflow or group size than its task's - each kind of forgery
a producer holding valid credentials could write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from astraflow.basemodel.tiny import create_tiny_checkpoint
from astraflow.config import parse_config
from astraflow.engines.base import encode_prompts
from astraflow.engines.loading import load_tokenizer
from astraflow.log import Message
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import DeadLetter, RolloutTask, TrainSample, Trajectory
from astraflow.streams.runtimes.issued_tasks import verifies_tasks
from astraflow.streams.runtimes.native import NativeStreamProcessor
from tests.unit.test_bad_input import read
from tests.unit.test_stream_operators import traj

PROMPT = "12+35="


def task(group: str) -> RolloutTask:
    return RolloutTask(group, f"p-{group}", group, "math", PROMPT, "47", 2, 0, 0)


@pytest.fixture
def ctx(tmp_path: Path):
    base = create_tiny_checkpoint(tmp_path / "base")
    raw = {
        "model": {"path": str(base)},
        "rollout": {"group_size": 2},
        "log": {"partitions": 1},
        "stream": {"max_staleness": 10, "verify_tasks": "on"},
    }
    context = ComponentContext(parse_config(raw), tmp_path / "run", "stream")
    yield context
    context.close()


def answer(ctx: ComponentContext, group: str, index: int, **changes: object) -> Trajectory:
    """Member ``index`` of the genuine answer to ``task(group)``: its ids and its prompt, as encoded."""
    prompt = encode_prompts(load_tokenizer(ctx.config.model.path), [PROMPT], False)[0]
    genuine = dataclasses.replace(traj(group, index, float(1 - index), size=2), prompt_id=f"p-{group}")
    return dataclasses.replace(genuine, **{"prompt_ids": prompt, **changes})


FORGERIES = {
    "never-issued": ({"task_id": "nobody-issued-this"}, "task_id: 'nobody-issued-this' was never issued"),
    "another-prompt": ({"prompt_ids": np.array([5, 6, 7], dtype=np.int32)}, "prompt_ids: not the prompt of task"),
    "another-prompt-id": ({"prompt_id": "p-other"}, "prompt_id: 'p-other' is not that of task"),
    "another-workflow": ({"workflow": "rooms"}, "workflow: 'rooms' is not that of task"),
}


@pytest.mark.parametrize("kind", list(FORGERIES))
def test_a_trajectory_that_is_not_its_tasks_is_dead_lettered(ctx: ComponentContext, kind: str) -> None:
    changes, reason = FORGERIES[kind]
    for group in ("good", "forged"):
        ctx.producer.send(ctx.topics.tasks(), ctx.codec.encode(task(group)), key=group.encode())
    ctx.producer.flush()
    processor = NativeStreamProcessor(ctx, "main")
    topic = ctx.topics.trajectories("main")
    records = [answer(ctx, "good", 0), answer(ctx, "good", 1), answer(ctx, "forged", 0, **changes)]
    records.append(answer(ctx, "forged", 1))
    processor.transactions.begin()
    accepted = []
    for offset, record in enumerate(records):
        message = Message(topic, 0, offset, record.group_id.encode(), ctx.codec.encode(record), 0)
        done = processor._add(message)
        if done is not None and processor._process(done, 0):
            accepted.append(done)
    processor._emit(accepted, 0)
    processor.transactions.commit()
    processor.close_followers()
    [letter] = read(ctx, ctx.topics.deadletter(ctx.role), DeadLetter)
    samples = read(ctx, ctx.topics.samples("main"), TrainSample)
    assert reason in letter.reason and letter.offset == 2, letter.reason
    assert sorted(s.sample_id for s in samples) == ["good/0", "good/1"]  # the forged group dropped as incomplete
    assert processor.drops == {"incomplete": 1}


def test_the_check_is_on_by_default_only_where_the_log_authenticates_each_role(tmp_path: Path) -> None:
    secure = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "role_credentials": str(tmp_path)}

    def config(log: dict, verify: str = "auto") -> ComponentContext:
        return type("Ctx", (), {"config": parse_config({"log": log, "stream": {"verify_tasks": verify}})})()

    assert verifies_tasks(config({"backend": "kafka", "bootstrap": "h:1", "security": secure}))
    assert not verifies_tasks(config({"backend": "kafka", "bootstrap": "h:1"}))
    assert not verifies_tasks(config({"backend": "embedded"}))
    assert verifies_tasks(config({"backend": "embedded"}, "on"))
    assert not verifies_tasks(config({"backend": "kafka", "bootstrap": "h:1", "security": secure}, "off"))
