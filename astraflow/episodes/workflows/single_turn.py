"""Single-turn workflows: one answer per sample, scored by a reward function; and several policies
playing the same tasks side by side."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from astraflow.core.errors import ConfigError, RewardError
from astraflow.engines.base import Engine
from astraflow.episodes.loop import Transcript
from astraflow.episodes.workflows.base import Provenance, TaskOutcome, Workflow, make_trajectory, score
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.arithmetic import exact_match_reward


class SingleTurnWorkflow(Workflow):
    """One policy answers each prompt ``group_size`` times; a reward function scores each answer."""

    def __init__(
        self, policy: str, reward: Callable[[str, str], float], max_new_tokens: int, temperature: float
    ) -> None:
        self.policies = (policy,)
        self.policy = policy
        self.reward = reward
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature

    def run_batch(
        self, engines: Mapping[str, Engine], tasks: list[RolloutTask], provenance: Provenance
    ) -> list[TaskOutcome]:
        engine = engines[self.policy]
        started = time.perf_counter()
        groups = engine.generate(
            [t.prompt for t in tasks],
            n=tasks[0].group_size,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
        )
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
                    outcome.trajectories.append(
                        make_trajectory(
                            task,
                            index,
                            self.policy,
                            transcript,
                            {"reward": reward},
                            generation.finish_reason,
                            generation.text,
                            provenance,
                            generate_ms=generate_ms,
                            reward_ms=reward_ms,
                        )
                    )
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

    def run_batch(
        self, engines: Mapping[str, Engine], tasks: list[RolloutTask], provenance: Provenance
    ) -> list[TaskOutcome]:
        outcomes = [TaskOutcome(task) for task in tasks]
        for policy, workflow in self.workflows.items():
            sized = [replace(task, group_size=self.group_sizes[policy]) for task in tasks]
            for outcome, played in zip(outcomes, workflow.run_batch(engines, sized, provenance)):
                if outcome.error is None and played.error is not None:
                    outcome.trajectories, outcome.error = [], played.error  # the task fails as a whole
                elif outcome.error is None:
                    outcome.trajectories.extend(played.trajectories)
        return outcomes


def reward_function(name: str) -> Callable[[str, str], float]:
    """The reward function named in the config."""
    if name == "exact_match":
        return exact_match_reward
    raise ConfigError(f"rollout.reward: unknown reward {name!r}; choose 'exact_match'")
