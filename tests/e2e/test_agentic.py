"""Agentic workloads end to end (issue #10).

The search and code examples run as ``astraflow run`` (every component its own process, records on
the embedded log). Search: warmed up on demonstrations that mostly guess, the policy learns to call
the search tool and copy what it finds. Code: warmed up to ~0.17 of the held-out tests, the policy
learns from the tests its programs pass in the sandbox. Each stops on versions and asserts that the
mean of the evaluator's last two greedy held-out scores rose above the base by a margin; with the
trainer's learning rate at 0 the weights never change, so the gain is 0 and both fail. The code and
rooms examples are played, trained and evaluated in one process with the
same pieces the components use (warm-up on demonstrations, the workflow with its sandbox or game,
the stream pipeline, a trainer step, greedy evaluation), which checks them end to end at a
fraction of the cost of more process trees.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.cache import ensure_base_checkpoint
from astraflow.config import load_config, write_config_over
from astraflow.engines.loading import load_policy
from astraflow.engines.torch_engine import TorchEngine
from astraflow.episodes.heldout import evaluate_episodes
from astraflow.episodes.loop import AgentLimits
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.factory import build_run_workflow
from astraflow.infra.launch.monitor import gain_over_base
from astraflow.log import TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import RolloutTask, Trajectory
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.pipeline import build_pipeline
from astraflow.tasks.catalog import open_environments
from astraflow.tasks.datasets import load_task_split
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer
from tests.e2e.conftest import run_to_end

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_config(name: str, path: Path, **sections: dict | str) -> Path:
    """``examples/<name>/config.yaml`` with ``sections`` merged over it, written to ``path``."""
    return write_config_over(EXAMPLES / name / "config.yaml", path, **sections)


@pytest.mark.solo
def test_search_run_learns_to_use_the_tool(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # bounded by versions, not minutes, so a loaded machine is only slower; never by the accuracy it
    # asserts. The base guesses (~0.1); measured 0.105 -> 0.68 at version 5 and 0.71 at 10
    # (benchmarks/results/agentic.json), so evaluations at 3 and 6 are both well into learning. Run
    # alone (solo) it takes ~2 minutes with its cold warm-up; sharing the cores in CI it took 392 s
    config = example_config(
        "search",
        tmp_path / "search.yaml",
        run="agentic",
        eval={"every_versions": 3},
        stop={"max_versions": 6, "max_minutes": 30, "target_accuracy": None},
    )
    run_to_end(config, run_dir, timeout=2400)
    summary = json.loads((run_dir / "summary.json").read_text())
    # greedy held-out success, one search episode per question, measured by the evaluator process:
    # the mean of the last two evaluations (200 questions each, so one varies by ~0.035)
    assert summary["versions"] >= 6, summary
    accuracy = {int(version): value for version, value in summary["accuracy_by_version"].items()}
    assert gain_over_base(accuracy) >= 0.2, summary
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        consumer = log.consumer()
        partitions = [TopicPartition("agentic.trajectories.main", p) for p in range(2)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        trajectories = [Codec().decode(m.value, expect=Trajectory) for m in consumer.poll(max_records=500, timeout=5.0)]
        consumer.close()
    searched = [t for t in trajectories if [turn.role for turn in t.turns][:3] == ["policy", "tool", "policy"]]
    assert searched, "no episode called the search tool"
    for trajectory in searched:
        tool = trajectory.turns[1]
        assert (trajectory.loss_mask[tool.start : tool.end] == 0).all() and (
            trajectory.loss_mask[: tool.start] == 1
        ).all()


@pytest.mark.solo
def test_code_run_learns_from_the_tests_its_programs_pass(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # bounded by versions, never by the score it asserts, and run alone (marked solo: make test runs
    # it after the tests that share the cores; ~3.5 minutes with its cold warm-up of ~85 s). Held-out
    # scores move by up to ~0.05 from one evaluation to the next while it learns, so it runs 16 versions:
    # measured here, the mean of the evaluations at 12 and 16 was +0.07, +0.09, +0.10, +0.12, +0.13 over
    # the base (0.18) in five runs of the example evaluated every 2 versions; at 8 and 12 it was +0.06
    # to +0.09 there, and +0.03 in a CI run: too close to any margin to assert. Those runs share one base
    # (0.181, where the warm-up's first evaluation crossed 0.17, at step 275). Bases of another float
    # order (the same warm-up cut into micro-batches) learned less: crossing at step 200 (0.188), -0.04 and,
    # at twice the lr, +0.105 and -0.01; stopped at step 275 (0.172), +0.008; and the 10-minute example
    # on the first of them +0.19 where this base gives +0.30. A machine whose arithmetic builds another
    # base may fail this test; that is the test's known weakness (issue #26)
    config = example_config(
        "code",
        tmp_path / "code.yaml",
        run="agentic-code",
        eval={"every_versions": 4},
        stop={"max_versions": 16, "max_minutes": 30},
    )
    run_to_end(config, run_dir, timeout=2400)
    summary = json.loads((run_dir / "summary.json").read_text())
    accuracy = {int(version): value for version, value in summary["accuracy_by_version"].items()}
    # greedy held-out tests passed (64 programs of 5 tests each), the mean of the evaluations at 12 and
    # 16 against the base; with train.lr 0 the weights never change, every evaluation is the base's, and
    # the gain is 0 (measured -0.003 while the evaluator scored its base unrounded, 9729754)
    assert summary["versions"] >= 16 and max(accuracy) >= 16, summary
    assert gain_over_base(accuracy) >= 0.04, summary


@pytest.mark.parametrize("example", ["code", "rooms"])
def test_example_plays_trains_and_evaluates(example: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # a short warm-up, 4 tasks x 4 episodes, a generous wall limit: programs start slowly on a loaded machine
    config = load_config(
        EXAMPLES / example / "config.yaml",
        {
            "task.heldout_size": 16,
            "warmup.max_steps": 5,
            "warmup.eval_every": 5,
            "warmup.batch_size": 8,
            "agent.sandbox.wall_seconds": 20.0,
        },
    )
    base = ensure_base_checkpoint(config, run_dir)  # a short warm-up on demonstrations, in the run's environments
    assert json.loads((base / "warmup.json").read_text())["steps"] >= 1
    model, tokenizer = load_policy(base)
    engine = TorchEngine(model, tokenizer, seed=0)
    workflow = build_run_workflow(config, run_dir / "data")
    workflow.open()
    rows = load_task_split(config.task, run_dir, "train")[:4]
    tasks = [
        RolloutTask(f"{row.prompt_id}@0", row.prompt_id, f"{row.prompt_id}@0", example, row.prompt, row.answer, 4, 0, 0)
        for row in rows
    ]
    outcomes = workflow.run_batch({"main": engine}, tasks, Provenance("e2e", "local", "cpu"))
    assert all(outcome.error is None for outcome in outcomes), [o.error for o in outcomes]
    trajectories = [Codec().decode(Codec().encode(t), expect=Trajectory) for o in outcomes for t in o.trajectories]
    assert len(trajectories) == 16
    for trajectory in trajectories:
        for turn in trajectory.turns:
            assert (trajectory.loss_mask[turn.start : turn.end] == (turn.role == "policy")).all()
    if example == "code":  # programs ran in the sandbox (a turn cut at its token budget runs none)
        assert (
            sum(t.reward_components["attempts"] for t in trajectories)
            >= sum(t.finish_reason != "length" for t in trajectories)
            > 0
        )

    pipeline = build_pipeline(config.stream)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, PolicyStepConfig(lr=config.train.lr, lr_warmup_steps=0))
    examples = []
    for outcome in outcomes:
        group = Group(outcome.task.group_id, [t for t in trajectories if t.group_id == outcome.task.group_id])
        if pipeline.process(group, trainer_version=0) is None:
            # rooms runs GiGPO: one advantage per token, as the trainer reads a TrainSample's token_advantages
            # (after a 5-step warm-up its games rarely differ; tests/unit/test_gigpo.py trains on them for sure)
            advantages = group.token_advantages or [float(a) for a in group.advantages]
            assert (group.token_advantages is not None) == (example == "rooms")
            examples += [
                PolicyExample(t.prompt_ids, t.response_ids, t.behaviour_logprobs, t.loss_mask, a)
                for t, a in zip(group.trajectories, advantages, strict=True)
            ]
    # The pipeline keeps only groups whose rewards differ (GRPO's zero-variance filter); what it
    # keeps moves the weights, and a batch it empties trains nothing (no forced step): this checks
    # the path from episodes to an optimizer step, not learning, which benchmarks/agentic.py measures.
    before = {name: value.detach().clone() for name, value in model.state_dict().items()}
    if examples:
        assert any(np.any(e.advantage != 0.0) for e in examples)
        trainer.step(examples)
        assert trainer.version == 1
        assert any(not torch.equal(before[name], value) for name, value in model.state_dict().items())
    else:
        assert all(len({t.reward for t in trajectories if t.group_id == o.task.group_id}) == 1 for o in outcomes)
    make_env = open_environments(config.rollout.workflow, config.rollout.reward, config.agent, run_dir / "data")
    score = evaluate_episodes(
        model,
        tokenizer,
        load_task_split(config.task, run_dir, "heldout")[:8],
        make_env,
        AgentLimits.from_config(config.agent, config.rollout.max_new_tokens),
    )
    assert 0.0 <= score <= 1.0 and np.isfinite(score)
