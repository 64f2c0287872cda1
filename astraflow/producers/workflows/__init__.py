"""Workflows: what a rollout producer does with a batch of tasks, policy by policy.

A workflow receives the engines of the policies it involves (by policy name) and a batch of
tasks, and returns, per task, either its trajectories or the reason it failed. Workflows own the
episode logic (turns, tools, rewards); the producer only moves records. Batching across tasks
lets one engine call serve many episodes.

Rewards that raise, or return a value that is not a finite number, are failures of the task
(dead-lettered with the reason by the producer), never a silent zero: a wrong answer scores 0, a
broken reward function is an error.
"""

from __future__ import annotations

import math
import numbers
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from astraflow.envs.episodes import Transcript
from astraflow.errors import ConfigError, RewardError
from astraflow.schemas.records import RolloutTask, Trajectory

if TYPE_CHECKING:
    from pathlib import Path

    from astraflow.config import AgentConfig, RunConfig


@dataclass
class Provenance:
    """Who produced the trajectories: recorded on every one of them."""

    producer_id: str
    region: str
    hardware: str


@dataclass
class TaskOutcome:
    """The trajectories of one task, or why there are none."""

    task: RolloutTask
    trajectories: list[Trajectory] = field(default_factory=list)
    error: Exception | None = None


class Workflow(ABC):
    """Runs episodes of a batch of tasks with the engines of the policies involved."""

    policies: tuple[str, ...]

    @abstractmethod
    def run_batch(self, engines: Mapping[str, object], tasks: list[RolloutTask], provenance: Provenance) -> list[TaskOutcome]:
        """One outcome per task, in task order."""

    def open(self) -> None:
        """Open what every episode shares (a search index, a sandbox), so a producer fails at start-up
        rather than on its first batch when it cannot; workflows that share nothing do nothing."""

    def groups_per_task(self, policy: str) -> int:
        """Groups of ``policy``'s trajectories one task yields (the feeder's back-pressure counts them)."""
        return 1


class SingleTurnWorkflow(Workflow):
    """One policy answers each prompt ``group_size`` times; a reward function scores each answer."""

    def __init__(self, policy: str, reward: Callable[[str, str], float], max_new_tokens: int, temperature: float) -> None:
        self.policies = (policy,)
        self.policy = policy
        self.reward = reward
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature

    def run_batch(self, engines: Mapping[str, object], tasks: list[RolloutTask], provenance: Provenance) -> list[TaskOutcome]:
        engine = engines[self.policy]
        started = time.perf_counter()
        groups = engine.generate([t.prompt for t in tasks], n=tasks[0].group_size, max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        generate_ms = (time.perf_counter() - started) * 1000 / max(len(tasks), 1)
        outcomes = []
        for task, generations in zip(tasks, groups):
            outcome = TaskOutcome(task)
            try:
                for index, generation in enumerate(generations):
                    t0 = time.perf_counter()
                    reward = score(self.reward, generation.text, task.reference)
                    reward_ms = (time.perf_counter() - t0) * 1000
                    transcript = Transcript(generation.prompt_ids)
                    transcript.append(generation.response_ids, generation.logprobs, engine.version, "policy")
                    outcome.trajectories.append(make_trajectory(task, index, self.policy, transcript, {"reward": reward}, generation.finish_reason,
                                                                generation.text, provenance, generate_ms=generate_ms, reward_ms=reward_ms))
            except RewardError as exc:
                outcome.trajectories, outcome.error = [], exc
            outcomes.append(outcome)
        return outcomes


class IndependentPolicies(Workflow):
    """Several policies, each playing the same tasks on its own with its own workflow (its narrowed
    config: group size, token budget, temperature): a population of policies trained side by side,
    e.g. to compare recipes on one stream of tasks. Each task yields one group per policy."""

    def __init__(self, workflows: dict[str, Workflow], group_sizes: dict[str, int]) -> None:
        self.workflows = workflows
        self.group_sizes = group_sizes
        self.policies = tuple(workflows)

    def open(self) -> None:
        for workflow in self.workflows.values():
            workflow.open()

    def run_batch(self, engines: Mapping[str, object], tasks: list[RolloutTask], provenance: Provenance) -> list[TaskOutcome]:
        outcomes = [TaskOutcome(task) for task in tasks]
        for policy, workflow in self.workflows.items():
            sized = [replace(task, group_size=self.group_sizes[policy]) for task in tasks]
            for outcome, played in zip(outcomes, workflow.run_batch(engines, sized, provenance)):
                if outcome.error is None and played.error is not None:
                    outcome.trajectories, outcome.error = [], played.error  # the task fails as a whole
                elif outcome.error is None:
                    outcome.trajectories.extend(played.trajectories)
        return outcomes


def make_trajectory(task: RolloutTask, index: int, policy: str, transcript: Transcript, components: dict[str, float], finish_reason: str,
                    text: str, provenance: Provenance, *, generate_ms: float, reward_ms: float) -> Trajectory:
    """The Trajectory of sample ``index`` of ``task``: every workflow builds its records here.

    ``transcript`` holds the response turn by turn, as sampled (``astraflow.envs.episodes``);
    ``components`` the named rewards, the scalar under ``"reward"``; ``text`` the response as
    people read it. The id ``{task_id}/{index}`` is deterministic, so a task redone after a crash
    yields the same ids (the stream drops the duplicates).
    """
    response_ids, logprobs, versions, mask = transcript.arrays()
    trajectory_id = f"{task.task_id}/{index}"
    return Trajectory(
        trajectory_id=trajectory_id,
        episode_id=trajectory_id,
        group_id=task.group_id,
        task_id=task.task_id,
        prompt_id=task.prompt_id,
        policy=policy,
        workflow=task.workflow,
        prompt_ids=np.asarray(transcript.prompt_ids, dtype=np.int32),
        response_ids=response_ids,
        behaviour_logprobs=logprobs,
        token_versions=versions,
        loss_mask=mask,
        reward=float(components["reward"]),
        reward_components=dict(components),
        turns=list(transcript.turns),
        response_text=text,
        finish_reason=finish_reason,
        group_size=task.group_size,
        producer_id=provenance.producer_id,
        region=provenance.region,
        hardware=provenance.hardware,
        generate_ms=generate_ms,
        reward_ms=reward_ms,
        created_ms=int(time.time() * 1000),
    )


def score(reward: Callable[[str, str], float], text: str, reference: str) -> float:
    """``reward(text, reference)``; ``RewardError`` when it raises or gives no finite number."""
    try:
        value = reward(text, reference)
    except RewardError:
        raise
    except Exception as exc:  # any bug of a pluggable reward function fails the task, with its cause
        raise RewardError(f"reward function {getattr(reward, '__name__', reward)!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise RewardError(f"reward function {getattr(reward, '__name__', reward)!r} returned {value!r}, not a finite number")
    return float(value)


def reward_function(name: str) -> Callable[[str, str], float]:
    """The reward function named in the config."""
    if name == "exact_match":
        from astraflow.tasks.arithmetic import exact_match_reward

        return exact_match_reward
    raise ConfigError(f"rollout.reward: unknown reward {name!r}; choose 'exact_match'")


def build_workflow(kind: str, policy: str, reward: str, max_new_tokens: int, temperature: float, agent: AgentConfig | None = None, data_dir: Path | None = None) -> Workflow:
    """The workflow named by ``rollout.workflow``; the multi-turn ones (``multiturn.py``) also
    read the ``agent`` section and the run's data directory (where the task wrote its corpus)."""
    if kind == "single_turn":
        return SingleTurnWorkflow(policy, reward_function(reward), max_new_tokens, temperature)
    from astraflow.config import AgentConfig
    from astraflow.producers.workflows.multiturn import build_multi_turn_workflow

    return build_multi_turn_workflow(kind, policy, reward, max_new_tokens, temperature, agent or AgentConfig(), data_dir)


def build_run_workflow(config: RunConfig, data_dir: Path | None = None) -> Workflow:
    """The workflow of a run config: a multi-policy one (``collab_workflows.py``) gets the policies'
    narrowed configs; with several policies, any other workflow is played by each policy on its
    own (``IndependentPolicies``); else the single ``policy``'s."""
    cfg = config.for_policy(config.policy_names()[0]) if config.policies else config
    r = cfg.rollout
    if r.workflow == "solver_verifier":
        from astraflow.producers.workflows.collab import build_collab_workflow

        return build_collab_workflow(r.workflow, [config.for_policy(name) for name in config.policy_names()])
    if len(config.policy_names()) > 1:
        narrowed = {name: config.for_policy(name) for name in config.policy_names()}
        return IndependentPolicies(
            {name: build_workflow(c.rollout.workflow, name, c.rollout.reward, c.rollout.max_new_tokens, c.rollout.temperature, c.agent, data_dir)
             for name, c in narrowed.items()},
            {name: c.rollout.group_size for name, c in narrowed.items()},
        )
    return build_workflow(r.workflow, cfg.policy, r.reward, r.max_new_tokens, r.temperature, cfg.agent, data_dir)
