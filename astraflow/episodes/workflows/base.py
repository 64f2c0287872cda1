"""The workflow contract: what a rollout producer does with a batch of tasks, policy by policy.

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
from dataclasses import dataclass, field

import numpy as np

from astraflow.core.errors import RewardError
from astraflow.engines.base import Engine
from astraflow.episodes.loop import EpisodeJournal, Transcript
from astraflow.schemas.records import RolloutTask, Trajectory


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
    journal: EpisodeJournal | None = None
    """Where a workflow whose episodes take turns records them as they complete and finds those a stopped
    producer left (``episodes.loop``, "Resuming"); the rollout producer sets it on a workflow that
    ``resumes``."""
    resumes: bool = False
    """Whether the workflow's episodes can be resumed from recorded turns (it uses ``journal``)."""

    @abstractmethod
    def run_batch(
        self, engines: Mapping[str, Engine], tasks: list[RolloutTask], provenance: Provenance
    ) -> list[TaskOutcome]:
        """One outcome per task, in task order."""

    def open(self) -> None:
        """Open what every episode shares (a search index, a sandbox), so a producer fails at start-up
        rather than on its first batch when it cannot; workflows that share nothing do nothing."""

    def groups_per_task(self, policy: str) -> int:
        """Groups of ``policy``'s trajectories one task yields (the feeder's back-pressure counts them)."""
        return 1


def make_trajectory(
    task: RolloutTask,
    index: int,
    policy: str,
    transcript: Transcript,
    components: dict[str, float],
    finish_reason: str,
    text: str,
    provenance: Provenance,
    *,
    generate_ms: float,
    reward_ms: float,
    producers: list[str] | None = None,
    resumes: int = 0,
) -> Trajectory:
    """The Trajectory of sample ``index`` of ``task``: every workflow builds its records here.

    ``transcript`` holds the response turn by turn, as sampled (``astraflow.episodes.loop``);
    ``components`` the named rewards, the scalar under ``"reward"``; ``text`` the response as
    people read it. The id ``{task_id}/{index}`` is deterministic, so a task redone after a crash
    yields the same ids (the stream drops the duplicates). ``producers`` and ``resumes``: those of an
    episode resumed from recorded turns (``episodes.loop.resume``), this producer last.
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
        producers=[*producers, provenance.producer_id] if producers else [],
        resumes=resumes,
    )


def score(reward: Callable[[str, str], float], text: str, reference: str) -> float:
    """``reward(text, reference)``; ``RewardError`` when it raises or gives no finite number."""
    try:
        value = reward(text, reference)
    except RewardError:
        raise
    except Exception as exc:  # any bug of a pluggable reward function fails the task, with its cause
        raise RewardError(
            f"reward function {getattr(reward, '__name__', reward)!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise RewardError(
            f"reward function {getattr(reward, '__name__', reward)!r} returned {value!r}, not a finite number"
        )
    return float(value)
