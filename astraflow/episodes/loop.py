"""Playing episodes: a policy's turns against one environment each, token-exact.

Shared by the rollout producers (``MultiTurnWorkflow`` turns episodes into Trajectory records),
the warm-up (demonstrations, held-out success) and the evaluator (greedy held-out success), so
all three play the very same episodes. ``play`` runs ``group_size`` episodes per task; one round
of its loop is:

1. **Policy turn**, batched over every live episode: the engine continues each episode's token
   ids (prompt + every earlier turn, exactly as stored) until the end-of-turn token (eos) or the
   turn's budget. The sampled ids, their behaviour log-probs and the engine's weight version are
   appended as they came out of the sampler, loss mask 1.
2. **Environment turn**, episodes in parallel on a small thread pool (an environment class with
   ``batch_steps`` takes its episodes in one chunk per worker, ``EpisodeEnv.step_many``): the
   turn's ids are decoded only so the environment can read them; its answer is tokenised *on its own* and appended with
   loss mask 0, log-prob 0 and the version of the turn it answers. The transcript is never
   decoded and re-tokenised as a whole, the bug class of TRL #5224: what the trainer scores is
   exactly what the sampler produced and conditioned on.
3. **Limits**: an episode ends when the environment says ``done`` (``stop``), when a turn hits
   its token budget without eos (``length``), after ``max_turns`` policy turns (``turn_limit``),
   when the response would exceed ``max_total_tokens`` (``token_limit``), or when its tool time
   exceeds ``max_tool_seconds`` (``tool_time_limit``). Then the environment scores it.

The engine is anything with ``tokenizer``, ``version`` and ``generate_ids(contexts,
max_new_tokens, temperature, greedy)`` returning samples with ``ids``, ``logprobs`` and
``stopped`` (``astraflow.engines.base.TokenEngine``). Any ``AstraFlowError`` from an
environment (server down, sandbox broken), or a score without a finite ``reward``, fails the
whole task: its group would be incomplete, and a broken environment must not look like a zero
reward. Every environment is closed, whatever happened.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from astraflow.core.errors import AstraFlowError, RewardError
from astraflow.envs.base import EnvError, EnvFactory, EpisodeEnv, StepResult
from astraflow.schemas.records import RolloutTask, Turn

if TYPE_CHECKING:
    from astraflow.config import AgentConfig
    from astraflow.engines.base import TokenEngine

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


def play(
    engine: TokenEngine,
    tasks: Sequence[RolloutTask],
    make_env: EnvFactory,
    limits: AgentLimits,
    temperature: float,
    greedy: bool = False,
) -> tuple[list[Episode], dict[int, AstraFlowError]]:
    """Play ``group_size`` episodes of every task to their end; returns the episodes (scored) and
    the failed tasks by position (their episodes carry no score)."""
    failed: dict[int, AstraFlowError] = {}
    episodes: list[Episode] = []
    try:
        for pos, task in enumerate(tasks):
            try:
                for index in range(task.group_size):
                    episodes.append(Episode(pos, index, make_env(task, index)))
                    episodes[-1].transcript = Transcript(
                        encode_prompt(engine.tokenizer, episodes[-1].env.reset(), task.task_id)
                    )
            except AstraFlowError as exc:
                failed[pos] = exc
        with ThreadPoolExecutor(limits.tool_workers, thread_name_prefix="env") as pool:
            live = [e for e in episodes if e.task_pos not in failed]
            while live:
                _policy_turn(engine, live, limits, temperature, greedy)
                _environment_turn(engine, pool, [e for e in live if e.finish_reason is None], limits, failed)
                live = [e for e in live if e.finish_reason is None and e.task_pos not in failed]
        for episode in episodes:
            if episode.task_pos not in failed:
                try:
                    episode.score = _score(episode, tasks[episode.task_pos])
                except AstraFlowError as exc:
                    failed[episode.task_pos] = exc
    finally:
        for episode in episodes:
            _close(episode)
    return episodes, failed


def _policy_turn(
    engine: TokenEngine, live: list[Episode], limits: AgentLimits, temperature: float, greedy: bool
) -> None:
    budgets = [min(limits.max_new_tokens, limits.max_total_tokens - e.transcript.length) for e in live]
    version = engine.version
    started = time.perf_counter()
    samples = engine.generate_ids([e.transcript.context() for e in live], max(budgets), temperature, greedy)
    share_ms = (time.perf_counter() - started) * 1000 / len(live)
    for episode, sample, budget in zip(live, samples, budgets, strict=True):
        episode.transcript.append(sample.ids[:budget], sample.logprobs[:budget], version, "policy")
        episode.policy_turns += 1
        episode.generate_ms += share_ms
        if not (sample.stopped and len(sample.ids) <= budget):
            episode.finish_reason = "token_limit" if episode.transcript.length >= limits.max_total_tokens else "length"


def _environment_turn(
    engine: TokenEngine,
    pool: ThreadPoolExecutor,
    acting: list[Episode],
    limits: AgentLimits,
    failed: dict[int, AstraFlowError],
) -> None:
    actions = [engine.tokenizer.decode(e.transcript.last_policy_ids(), skip_special_tokens=True) for e in acting]
    chunks = _chunks(acting, actions, limits.tool_workers)
    futures = [pool.submit(_steps, episodes, chunk_actions) for episodes, chunk_actions in chunks]
    for (episodes, _), future in zip(chunks, futures):
        try:
            results = future.result()
        except AstraFlowError as exc:
            for episode in episodes:
                failed.setdefault(episode.task_pos, exc)
            continue
        for episode, result in zip(episodes, results, strict=True):
            episode.observe(result, engine.tokenizer, limits)


def _chunks(acting: list[Episode], actions: list[str], workers: int) -> list[tuple[list[Episode], list[str]]]:
    """The turns each pool task takes: one per episode, or, for an environment class with ``batch_steps``,
    its episodes in ``workers`` contiguous chunks (a group's episodes mostly in one)."""
    chunks: list[tuple[list[Episode], list[str]]] = []
    batched: dict[type, list[int]] = {}
    for i, episode in enumerate(acting):
        if type(episode.env).batch_steps:
            batched.setdefault(type(episode.env), []).append(i)
        else:
            chunks.append(([episode], [actions[i]]))
    for positions in batched.values():
        size = -(-len(positions) // workers)
        for first in range(0, len(positions), size):
            chunk = positions[first : first + size]
            chunks.append(([acting[i] for i in chunk], [actions[i] for i in chunk]))
    return chunks


def _steps(episodes: list[Episode], actions: list[str]) -> list[StepResult]:
    """The environment turns of ``episodes``, each charged its share of the time they took together."""
    started = time.perf_counter()
    try:
        if len(episodes) == 1:
            return [episodes[0].env.step(actions[0])]
        return type(episodes[0].env).step_many([e.env for e in episodes], actions)
    finally:
        share = (time.perf_counter() - started) / len(episodes)
        for episode in episodes:
            episode.tool_seconds += share


def _score(episode: Episode, task: RolloutTask) -> dict[str, float]:
    components = {name: float(value) for name, value in episode.env.reward().items()}
    if not math.isfinite(components.get("reward", math.nan)):
        raise RewardError(f"the environment of task {task.task_id} gave no finite 'reward' (got {components})")
    return components


def _close(episode: Episode) -> None:
    try:
        episode.env.close()
    except AstraFlowError as exc:
        logger.warning("closing the environment of episode %d failed: %s", episode.index, exc)


def demonstrate(
    env: EpisodeEnv, actions: Sequence[str], tokenizer, limits: AgentLimits, task_id: str = "demo"
) -> Transcript:
    """The transcript of playing ``actions`` (each a whole policy turn, eos appended) in ``env``,
    built exactly as ``play`` builds one: what the warm-up supervises. The environment answers
    every action but the last; an episode that ends early (``done``) drops the remaining actions."""
    episode = Episode(0, 0, env)
    try:
        episode.transcript = Transcript(encode_prompt(tokenizer, env.reset(), task_id))
        for position, action in enumerate(actions):
            ids = [*tokenizer(action, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
            episode.transcript.append(
                np.asarray(ids, dtype=np.int32), np.zeros(len(ids), dtype=np.float32), 0, "policy"
            )
            episode.policy_turns += 1
            if position == len(actions) - 1:
                break
            episode.observe(_steps([episode], [action])[0], tokenizer, limits)
            if episode.finish_reason is not None:
                break
    finally:
        _close(episode)
    return episode.transcript
