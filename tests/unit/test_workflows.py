"""The single-turn workflow on a real (tiny, untrained) model: ids, versions, rewards, failures."""

from __future__ import annotations

import numpy as np
import pytest

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.core.errors import ConfigError, RewardError
from astraflow.engines.torch_engine import TorchEngine
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.factory import build_workflow
from astraflow.episodes.workflows.single_turn import SingleTurnWorkflow
from astraflow.schemas.records import RolloutTask

PROVENANCE = Provenance("rollout-test-1", "eu", "cpu:x86_64x1")


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    tokenizer = build_char_tokenizer()
    return TorchEngine(
        build_tiny_model(tokenizer, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)),
        tokenizer,
        version=7,
        seed=0,
    )


def task(n: int, reference: str = "5") -> RolloutTask:
    return RolloutTask(
        f"p{n}@0", f"p{n}", f"p{n}@0", "math", f"{n}+1=", reference, group_size=3, submitted_version=0, created_ms=0
    )


def test_single_turn_trajectories(engine: TorchEngine) -> None:
    seen: list[tuple[str, str]] = []

    def reward(text: str, reference: str) -> float:
        seen.append((text, reference))
        return 1.0 if text == reference else 0.0

    outcomes = SingleTurnWorkflow("main", reward, max_new_tokens=4, temperature=1.0).run_batch(
        {"main": engine}, [task(1), task(2)], PROVENANCE
    )
    assert [o.task.task_id for o in outcomes] == ["p1@0", "p2@0"] and all(o.error is None for o in outcomes)
    trajectories = outcomes[1].trajectories
    assert [t.trajectory_id for t in trajectories] == ["p2@0/0", "p2@0/1", "p2@0/2"]
    for t in trajectories:
        n = len(t.response_ids)
        assert 1 <= n <= 4 and len(t.behaviour_logprobs) == n and (t.behaviour_logprobs <= 0).all()
        assert (t.token_versions == 7).all() and (t.loss_mask == 1).all() and t.min_version == 7
        assert t.turns[0].end == n and t.producer_id == "rollout-test-1" and t.region == "eu"
        assert t.group_id == "p2@0" and t.group_size == 3
    assert len(seen) == 6 and seen[3][1] == "5"


def test_a_raising_reward_fails_the_task_instead_of_scoring_zero(engine: TorchEngine) -> None:
    def broken(text: str, reference: str) -> float:
        raise RewardError("grader crashed")

    [outcome] = SingleTurnWorkflow("main", broken, 4, 1.0).run_batch({"main": engine}, [task(3)], PROVENANCE)
    assert isinstance(outcome.error, RewardError) and outcome.trajectories == []


@pytest.mark.parametrize(
    ("kind", "reward", "field"),
    [("multi_turn", "exact_match", "rollout.workflow"), ("single_turn", "bleu", "rollout.reward")],
)
def test_unknown_workflow_or_reward_names_the_field(kind: str, reward: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_workflow(kind, "main", reward, 4, 1.0)


def test_exact_match_workflow_from_config_scores_the_reference(engine: TorchEngine) -> None:
    workflow = build_workflow("single_turn", "main", "exact_match", 4, 1.0)
    [outcome] = workflow.run_batch({"main": engine}, [task(4, reference="x")], PROVENANCE)
    assert np.array_equal([t.reward for t in outcome.trajectories], [0.0, 0.0, 0.0])
