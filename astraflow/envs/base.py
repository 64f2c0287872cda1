"""The environment contract of multi-turn workflows: one ``EpisodeEnv`` per episode.

The workflow owns the tokens; an environment only sees and returns text. ``reset`` gives the
episode's prompt, ``step`` takes the text of one policy turn and returns the text to insert as an
environment turn (tokenised on its own and appended with loss mask 0), and ``reward`` scores the
episode once it has ended, by ``done`` or by one of the workflow's limits. Tools are environments
too: the search tool is an environment whose steps run queries.

Errors: a model mistake (a malformed call, a failing program) is an observation or a low reward;
an environment that cannot work (server down, sandbox broken, index missing) raises ``EnvError``
(or another ``AstraFlowError``), and the workflow fails the task instead of scoring it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from astraflow.core.errors import AstraFlowError
from astraflow.schemas.records import RolloutTask


class EnvError(AstraFlowError):
    """An environment could not run an episode (the task fails; its reward is never a silent 0)."""


@dataclass(frozen=True)
class StepResult:
    """What the environment answers to one policy turn."""

    observation: str  # inserted as an environment turn unless ``done``
    done: bool = False


class EpisodeEnv(ABC):
    """One episode of an environment or tool, driven by the text of the policy's turns."""

    role: str = "environment"  # Turn.role of the inserted spans ("tool" for tools)
    batch_steps: bool = False  # True: the workflow gives this class's turns to ``step_many`` in chunks

    @abstractmethod
    def reset(self) -> str:
        """Start the episode; returns its prompt."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Answer one policy turn (its decoded text, end-of-turn token stripped)."""

    @classmethod
    def step_many(cls, envs: Sequence[EpisodeEnv], actions: Sequence[str]) -> list[StepResult]:
        """``step`` of each of ``envs`` (this class's episodes) with its action, in order; a class whose
        turns are cheaper together (one sandbox for several programs) sets ``batch_steps`` and overrides
        this. An ``AstraFlowError`` fails the tasks of every episode given."""
        return [env.step(action) for env, action in zip(envs, actions, strict=True)]

    @abstractmethod
    def reward(self) -> dict[str, float]:
        """Score the ended episode: named components, the scalar under ``"reward"``."""

    def close(self) -> None:
        """Release what the episode holds (called once, whatever happened)."""


EnvFactory = Callable[[RolloutTask, int], EpisodeEnv]
"""Builds the environment of episode ``index`` of a task."""
