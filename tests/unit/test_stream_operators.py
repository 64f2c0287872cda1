"""Stream operators and the group buffer: staleness, zero variance, duplicates, safe offsets."""

from __future__ import annotations

import numpy as np
import pytest

from astraflow.config import StreamConfig
from astraflow.schemas.records import Trajectory
from astraflow.streams.operators import Group, GroupBuffer, StalenessFilter, build_pipeline, run_pipeline, validate


def traj(group: str, index: int, reward: float, version: int = 0, size: int = 4, n: int = 3) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group}/{index}", episode_id=f"{group}/{index}", group_id=group, task_id=group, prompt_id="p",
        policy="main", workflow="math", prompt_ids=np.arange(3, dtype=np.int32), response_ids=np.arange(n, dtype=np.int32),
        behaviour_logprobs=np.full(n, -0.5, dtype=np.float32), token_versions=np.full(n, version, dtype=np.int32),
        loss_mask=np.ones(n, dtype=np.uint8), reward=reward, group_size=size,
    )


@pytest.mark.parametrize(
    ("trainer_version", "token_version", "max_staleness", "dropped"),
    [(5, 5, 0, False), (5, 4, 0, True), (5, 3, 2, False), (5, 2, 2, True), (0, 0, 0, False)],
)
def test_staleness_filter(trainer_version: int, token_version: int, max_staleness: int, dropped: bool) -> None:
    group = Group("g", [traj("g", 0, 1.0, token_version)])
    reason = StalenessFilter(max_staleness)(group, trainer_version)
    assert (reason is not None) is dropped
    if dropped:
        assert reason.startswith("stale")


def test_min_version_ignores_masked_tokens() -> None:
    t = traj("g", 0, 1.0, version=7)
    t.token_versions = np.array([3, 7, 7], dtype=np.int32)
    t.loss_mask = np.array([0, 1, 1], dtype=np.uint8)
    assert t.min_version == 7


@pytest.mark.parametrize(
    ("rewards", "reason_prefix", "advantages"),
    [
        ([1, 0, 0, 0], None, [1.5, -0.5, -0.5, -0.5]),
        ([1, 1, 1, 1], "zero_variance", None),
        ([0, 0, 0, 0], "zero_variance", None),
    ],
)
def test_pipeline_grpo_then_zero_variance(rewards, reason_prefix, advantages) -> None:
    group = Group("g", [traj("g", i, r) for i, r in enumerate(rewards)])
    reason = run_pipeline(build_pipeline(StreamConfig(max_staleness=1)), group, trainer_version=0)
    if reason_prefix is None:
        assert reason is None
        np.testing.assert_allclose(group.advantages, advantages, atol=1e-5)
        assert group.operators == ["staleness", "grpo", "zero_variance"]
    else:
        assert reason.startswith(reason_prefix)


def test_zero_variance_kept_when_disabled() -> None:
    group = Group("g", [traj("g", i, 1.0) for i in range(4)])
    assert run_pipeline(build_pipeline(StreamConfig(drop_zero_variance=False)), group, 0) is None


def test_group_buffer_completes_groups_and_drops_duplicates() -> None:
    buffer = GroupBuffer()
    assert buffer.add(traj("a", 0, 1.0, size=2), partition=0, offset=10) is None
    assert buffer.add(traj("a", 0, 1.0, size=2), partition=0, offset=11) is None  # duplicate id
    assert buffer.add(traj("b", 0, 1.0, size=2), partition=1, offset=5) is None
    group = buffer.add(traj("a", 1, 0.0, size=2), partition=0, offset=12)
    assert group is not None and [t.trajectory_id for t in group.trajectories] == ["a/0", "a/1"]
    assert buffer.duplicates == 1
    assert buffer.add(traj("a", 1, 0.0, size=2), partition=0, offset=13) is None  # late duplicate of a done group
    assert buffer.duplicates == 2
    # partition 1 still holds half of group b from offset 5: commit no further than that
    assert buffer.safe_offsets({0: 14, 1: 9}) == {0: 14, 1: 5}


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("reward", float("nan"), "non-finite reward"),
        ("reward", float("inf"), "non-finite reward"),
        ("loss_mask", np.ones(2, dtype=np.uint8), "loss_mask has 2 entries"),
        ("behaviour_logprobs", np.array([0.0, np.nan, 0.0], dtype=np.float32), "non-finite behaviour"),
    ],
)
def test_validate_names_the_problem(field: str, value, problem: str) -> None:
    t = traj("g", 0, 1.0)
    setattr(t, field, value)
    assert problem in validate(t)
    assert validate(traj("g", 0, 1.0)) is None
