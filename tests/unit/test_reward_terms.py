"""``reward_terms``: reward shaping from the components a producer reports beside the reward."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from astraflow.config import parse_config
from astraflow.core.errors import ConfigError
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import DeadLetter, TrainSample, Trajectory
from astraflow.streams.operators.advantage import grpo_advantages
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.pipeline import build_pipeline
from astraflow.streams.runtimes.native import NativeStreamProcessor
from tests.unit.test_stream_operators import read_all, traj

SHAPED = [{"op": "reward_terms", "weights": {"invalid": -0.1}}, {"op": "grpo"}, {"op": "zero_variance"}]


def games(name: str, found: list[float], invalid: list[float]) -> list[Trajectory]:
    """A group of rooms games as the producer scores them: reward = found, with the invalid moves counted."""
    return [
        replace(traj(name, i, f, size=len(found)), reward_components={"found": f, "invalid": n, "moves": 3.0})
        for i, (f, n) in enumerate(zip(found, invalid, strict=True))
    ]


def test_shaped_rewards_feed_the_advantage_and_keep_groups_that_only_they_separate() -> None:
    pipeline = build_pipeline(parse_config({"stream": {"pipeline": SHAPED}}).stream)
    group = Group("g", games("g", [1, 1, 1, 1], [0, 1, 0, 2]))  # every game won, two with invalid moves
    assert pipeline.process(group, 0) is None
    np.testing.assert_allclose(group.rewards, [1.0, 0.9, 1.0, 0.8])
    np.testing.assert_allclose(group.raw_rewards, [1, 1, 1, 1])  # the producers' rewards stay as they were
    np.testing.assert_allclose(group.advantages, grpo_advantages(np.array([1.0, 0.9, 1.0, 0.8])))
    assert group.advantages[3] < group.advantages[1] < 0 < group.advantages[0]
    # without the terms the same games carry no signal and dynamic sampling drops them
    plain = build_pipeline(parse_config({"stream": {"pipeline": SHAPED[1:]}}).stream)
    assert plain.process(Group("g", games("g", [1, 1, 1, 1], [0, 1, 0, 2])), 0) == "zero_variance: all rewards equal"
    # terms that cancel out leave equal rewards, dropped as such
    equal = Group("h", games("h", [1, 0.9], [1, 0]))
    assert pipeline.process(equal, 0) == "zero_variance: all rewards equal"


@pytest.mark.parametrize(
    ("pipeline", "problem"),
    [
        ([{"op": "grpo"}, {"op": "reward_terms", "weights": {"invalid": -0.1}}], "reward_terms must come before grpo"),
        (
            [{"op": "reward_norm"}, {"op": "reward_terms", "weights": {"x": 1.0}}, {"op": "grpo"}],
            "reward_terms must come before reward_norm",
        ),
        ([{"op": "reward_terms", "weights": {}}, {"op": "grpo"}], "name at least one reward component"),
        ([{"op": "reward_terms", "weights": {"x": float("nan")}}, {"op": "grpo"}], "'x': nan is not a finite weight"),
        ([{"op": "reward_terms"}, {"op": "grpo"}], "weights"),
    ],
)
def test_misplaced_or_empty_terms_fail_when_the_config_loads(pipeline: list[dict], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config({"stream": {"pipeline": pipeline}})


@pytest.fixture
def ctx(tmp_path: Path):
    context = ComponentContext(parse_config({"stream": {"pipeline": SHAPED}}), tmp_path, "stream")
    yield context
    context.close()


def test_a_group_missing_a_component_is_dead_lettered_by_name(ctx: ComponentContext) -> None:
    processor = NativeStreamProcessor(ctx, "main")
    processor.transactions.begin()
    good = Group("a", games("a", [1, 0], [0, 1]))
    lacking = games("b", [1, 0], [0, 1])
    lacking[1] = replace(lacking[1], reward_components={"found": 0.0})  # an environment that counts no moves
    accepted = [g for g in (good, Group("b", lacking)) if processor._process(g, 0)]
    processor._emit(accepted, 0)
    processor.transactions.commit()
    ctx.producer.flush()
    samples = read_all(ctx, ctx.topics.samples("main"), TrainSample)
    assert sorted(s.sample_id for s in samples) == ["a/0", "a/1"]
    letters = read_all(ctx, ctx.topics.deadletter(ctx.role), DeadLetter)
    assert len(letters) == 2 and all(
        "reward_terms: trajectory b/1 has no reward component 'invalid' (its components: found)" in letter.reason
        for letter in letters
    )
