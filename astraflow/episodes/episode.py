"""One episode of a multi-turn workflow: its limits, its token-exact transcript, its state
(``loop.py`` plays episodes; ``resume.py`` brings one back to its recorded turns)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from astraflow.core.errors import AstraFlowError
from astraflow.envs.base import EnvError, EpisodeEnv, StepResult
from astraflow.schemas.records import Turn

if TYPE_CHECKING:
    from astraflow.config import AgentConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentLimits:
    """Bounds of one episode (``agent`` section of the config, plus ``rollout.max_new_tokens``)."""

    max_turns: int = 4  # policy turns
    max_new_tokens: int = 32  # tokens of one policy turn
    max_total_tokens: int = 256  # response tokens of the episode, policy and environment together
    max_observation_tokens: int = 64  # an environment turn longer than this is cut
    max_tool_seconds: float = 30.0  # environment time of the episode
    tool_workers: int = 4  # environment steps run in parallel

    @classmethod
    def from_config(cls, agent: AgentConfig, max_new_tokens: int) -> AgentLimits:
        return cls(
            agent.max_turns,
            max_new_tokens,
            agent.max_total_tokens,
            agent.max_observation_tokens,
            agent.max_tool_seconds,
            agent.tool_workers,
        )


@dataclass
class Transcript:
    """The token spans after a prompt, each with its log-probs, version and loss mask (1: policy)."""

    prompt_ids: np.ndarray  # [P] int32
    spans: list[tuple[np.ndarray, np.ndarray, int, int]] = field(default_factory=list)  # ids, logprobs, version, mask
    turns: list[Turn] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.turns[-1].end if self.turns else 0

    def context(self) -> np.ndarray:
        """[P + R] int32: what the policy conditions on for its next turn."""
        return np.concatenate([self.prompt_ids, *(span[0] for span in self.spans)]).astype(np.int32)

    def append(self, ids: np.ndarray, logprobs: np.ndarray, version: int, role: str) -> None:
        if len(ids):
            self.spans.append(
                (
                    np.asarray(ids, dtype=np.int32),
                    np.asarray(logprobs, dtype=np.float32),
                    version,
                    int(role == "policy"),
                )
            )
            self.turns.append(Turn(role, self.length, self.length + len(ids), version))

    def last_policy_ids(self) -> np.ndarray:
        return next(span[0] for span in reversed(self.spans) if span[3])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The response as [R] arrays: ids (int32), behaviour log-probs (float32), versions (int32),
        loss mask (uint8)."""
        if not self.spans:
            return np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32), np.zeros(0, np.uint8)
        ids, logprobs, versions, masks = zip(
            *((s[0], s[1], np.full(len(s[0]), s[2], np.int32), np.full(len(s[0]), s[3], np.uint8)) for s in self.spans)
        )
        return np.concatenate(ids), np.concatenate(logprobs), np.concatenate(versions), np.concatenate(masks)


@dataclass
class Episode:
    """One episode: its environment, transcript so far, and how it ended and scored."""

    task_pos: int
    index: int
    env: EpisodeEnv
    transcript: Transcript | None = None
    policy_turns: int = 0
    tool_seconds: float = 0.0
    generate_ms: float = 0.0
    finish_reason: str | None = None
    score: dict[str, float] = field(default_factory=dict)  # env.reward(), once ended
    producers: list[str] = field(default_factory=list)  # a resumed episode's producers before this one
    resumes: int = 0  # times the episode was resumed from recorded turns
    resumed_turns: int = 0  # policy turns taken from the record, not generated here

    def observe(self, result: StepResult, tokenizer, limits: AgentLimits) -> None:
        """Append the environment's answer to the last policy turn, or end the episode."""
        if result.done:
            self.finish_reason = "stop"
        elif self.policy_turns >= limits.max_turns:
            self.finish_reason = "turn_limit"
        elif self.tool_seconds > limits.max_tool_seconds:
            self.finish_reason = "tool_time_limit"
        else:
            ids = tokenizer(result.observation, add_special_tokens=False)["input_ids"][: limits.max_observation_tokens]
            if self.transcript.length + len(ids) >= limits.max_total_tokens:
                self.finish_reason = "token_limit"
            else:
                self.transcript.append(
                    np.asarray(ids, dtype=np.int32),
                    np.zeros(len(ids), dtype=np.float32),
                    self.transcript.turns[-1].version,
                    self.env.role,
                )


def encode_prompt(tokenizer, prompt: str, task_id: str) -> np.ndarray:
    """The prompt's ids, encoded on their own; ``EnvError`` for an empty prompt."""
    ids = np.asarray(tokenizer(prompt, add_special_tokens=False)["input_ids"], dtype=np.int32)
    if not len(ids):
        raise EnvError(f"the environment gave task {task_id} an empty prompt")
    return ids


def close_episode(episode: Episode) -> None:
    try:
        episode.env.close()
    except AstraFlowError as exc:
        logger.warning("closing the environment of episode %d failed: %s", episode.index, exc)
