"""Resuming an episode from its recorded turns (the rollout producer's episode journal).

``loop.play`` with a ``journal`` (the rollout producer's ``EpisodeJournal``): after every round, the
episodes still going are handed to ``journal.record`` (the producer commits their turns so far); an
episode the journal holds turns of (``journal.recorded``: a producer stopped in its middle) starts
from them (``start_episode``).
Its environment is reset and given the recorded policy turns' actions again, and must answer each
with the recorded tokens (``resume``): then the transcript is the recorded one, byte for byte, with
its log-probs and versions, and the engine generates only the turns after it. An environment that
answers differently (not deterministic) plays the episode from its first turn.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from astraflow.envs.base import EnvFactory
from astraflow.episodes.episode import AgentLimits, Episode, Transcript, close_episode, encode_prompt
from astraflow.schemas.records import RolloutTask, Trajectory

if TYPE_CHECKING:
    from astraflow.engines.base import TokenEngine

logger = logging.getLogger(__name__)


class EpisodeJournal(Protocol):
    """Where ``play`` records the turns of episodes still going, and finds those of an episode a stopped
    producer was playing (``producers/rollout/episode_journal.py``)."""

    def recorded(self, task: RolloutTask, index: int) -> Trajectory | None:
        """The recorded turns of episode ``index`` of ``task`` (a partial Trajectory), or ``None``;
        an ``AstraFlowError`` fails the task (an episode resumed too often)."""

    def resumed(self, tasks: Sequence[RolloutTask], episodes: list[Episode]) -> None:
        """``episodes`` had recorded turns: record that they were taken up (``Episode.resumes``) before
        generating any; those whose environment did not answer alike start over."""

    def record(self, tasks: Sequence[RolloutTask], episodes: list[Episode]) -> None:
        """``episodes`` each completed a turn and go on: record their turns so far."""

    def finished(self, episodes: list[Episode]) -> None:
        """Every episode of the batch has ended (or failed): count what was generated and resumed."""


def resume(episode: Episode, recorded: Trajectory, tokenizer, limits: AgentLimits) -> bool:
    """Bring ``episode`` (reset, its prompt in its transcript) to the end of its ``recorded`` turns: the
    recorded policy turns appended as they were sampled, each one's action given to the environment,
    whose answers must be the recorded ones. ``False`` (and the episode as it was) if they are not."""
    prompt = episode.transcript.prompt_ids
    if not np.array_equal(prompt, recorded.prompt_ids):
        return False
    rebuilt = Episode(episode.task_pos, episode.index, episode.env, Transcript(prompt))
    for turn in recorded.turns:
        if turn.role != "policy":
            continue  # the environment's answer: appended below by ``observe``, and compared at the end
        span = slice(turn.start, turn.end)
        ids, logprobs = recorded.response_ids[span], recorded.behaviour_logprobs[span]
        rebuilt.transcript.append(ids, logprobs, turn.version, "policy")
        rebuilt.policy_turns += 1
        action = tokenizer.decode(recorded.response_ids[span], skip_special_tokens=True)
        rebuilt.observe(episode.env.step(action), tokenizer, limits)
        if rebuilt.finish_reason is not None:
            return False
    ids, logprobs, versions, mask = rebuilt.transcript.arrays()
    same = (
        rebuilt.transcript.turns == list(recorded.turns)
        and np.array_equal(ids, recorded.response_ids)
        and np.array_equal(logprobs.view(np.uint32), recorded.behaviour_logprobs.view(np.uint32))
        and np.array_equal(versions, recorded.token_versions)
        and np.array_equal(mask, recorded.loss_mask)
    )
    if not same:
        return False
    episode.transcript = rebuilt.transcript
    episode.policy_turns = episode.resumed_turns = rebuilt.policy_turns
    episode.generate_ms = recorded.generate_ms
    episode.tool_seconds = recorded.reward_ms / 1000
    episode.producers = list(recorded.producers) or [recorded.producer_id]
    episode.resumes = recorded.resumes + 1
    return True


def start_episode(
    engine: TokenEngine,
    task: RolloutTask,
    pos: int,
    index: int,
    make_env: EnvFactory,
    limits: AgentLimits,
    journal: EpisodeJournal | None,
) -> Episode:
    """Episode ``index`` of ``task``, reset, and brought to the end of its recorded turns if it has any
    that its environment answers alike; otherwise from its first turn (a fresh environment)."""
    recorded = journal.recorded(task, index) if journal is not None else None
    episode = _reset(Episode(pos, index, make_env(task, index)), engine, task)
    if recorded is None:
        return episode
    try:
        if resume(episode, recorded, engine.tokenizer, limits):
            return episode
    finally:
        if not episode.resumes:
            close_episode(episode)
    logger.warning(
        "the environment of episode %s/%d did not answer its recorded turns alike; playing it from its start",
        task.task_id,
        index,
    )
    fresh = Episode(pos, index, make_env(task, index), resumes=recorded.resumes + 1)
    fresh.producers = list(recorded.producers) or [recorded.producer_id]
    return _reset(fresh, engine, task)


def _reset(episode: Episode, engine: TokenEngine, task: RolloutTask) -> Episode:
    """``episode`` with its prompt, or its environment closed and the error raised."""
    try:
        episode.transcript = Transcript(encode_prompt(engine.tokenizer, episode.env.reset(), task.task_id))
    except BaseException:
        close_episode(episode)
        raise
    return episode
