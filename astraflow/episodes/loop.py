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

A ``journal`` (the rollout producer's) records the turns of the episodes still going after every
round and starts an episode it holds turns of from them (``resume.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from astraflow.core.errors import AstraFlowError, RewardError
from astraflow.envs.base import EnvFactory, EpisodeEnv, StepResult
from astraflow.episodes.episode import AgentLimits, Episode, Transcript, close_episode, encode_prompt
from astraflow.episodes.resume import EpisodeJournal, start_episode
from astraflow.schemas.records import RolloutTask

if TYPE_CHECKING:
    from astraflow.engines.base import TokenEngine

__all__ = ["AgentLimits", "Episode", "EpisodeJournal", "Transcript", "demonstrate", "encode_prompt", "play"]
logger = logging.getLogger(__name__)


def play(
    engine: TokenEngine,
    tasks: Sequence[RolloutTask],
    make_env: EnvFactory,
    limits: AgentLimits,
    temperature: float,
    greedy: bool = False,
    journal: EpisodeJournal | None = None,
) -> tuple[list[Episode], dict[int, AstraFlowError]]:
    """Play ``group_size`` episodes of every task to their end, each from its recorded turns where
    ``journal`` holds some; returns the episodes (scored) and the failed tasks by position (their
    episodes carry no score)."""
    failed: dict[int, AstraFlowError] = {}
    episodes: list[Episode] = []
    try:
        for pos, task in enumerate(tasks):
            try:
                for index in range(task.group_size):
                    episodes.append(start_episode(engine, task, pos, index, make_env, limits, journal))
            except AstraFlowError as exc:
                failed[pos] = exc
        resumed = [e for e in episodes if e.resumes and e.task_pos not in failed]
        if journal is not None and resumed:
            journal.resumed(tasks, resumed)
        with ThreadPoolExecutor(limits.tool_workers, thread_name_prefix="env") as pool:
            live = [e for e in episodes if e.task_pos not in failed]
            while live:
                _policy_turn(engine, live, limits, temperature, greedy)
                _environment_turn(engine, pool, [e for e in live if e.finish_reason is None], limits, failed)
                live = [e for e in live if e.finish_reason is None and e.task_pos not in failed]
                if journal is not None and live:
                    journal.record(tasks, live)
        for episode in episodes:
            if episode.task_pos not in failed:
                try:
                    episode.score = _score(episode, tasks[episode.task_pos])
                except AstraFlowError as exc:
                    failed[episode.task_pos] = exc
        if journal is not None:
            journal.finished(episodes)
    finally:
        for episode in episodes:
            close_episode(episode)
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
        close_episode(episode)
    return episode.transcript
