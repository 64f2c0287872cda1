"""Greedy held-out scores, shared by the warm-up and the evaluator: exact match of one answer,
and the success rate of multi-turn episodes.

Lives beside the model code rather than in a component so that the supervised warm-up (a trainer)
and the evaluator both use it without importing each other. Multi-turn episodes are played by
``astraflow.episodes.loop.play``, the loop the rollout producers use, with greedy turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.engines.base import TurnSample
from astraflow.engines.sampling import PREFIX_CACHE_BYTES, PrefixCache, sample
from astraflow.envs.base import EnvFactory
from astraflow.episodes.loop import AgentLimits, play
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.arithmetic import exact_match_reward
from astraflow.tasks.base import Problem


def evaluate_exact_match(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int = 4,
    batch_size: int = 1024,
    reward: Callable[[str, str], float] = exact_match_reward,
) -> float:
    """Mean ``reward(greedy response, answer)`` over ``problems``: by default the fraction that match exactly."""
    was_training = model.training
    model.eval()
    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        batch = sample(
            model,
            tokenizer([problem.prompt for problem in chunk])["input_ids"],
            max_new_tokens=max_new_tokens,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            greedy=True,
        )
        texts = tokenizer.batch_decode(
            [batch.tokens[row, : batch.lengths[row]] for row in range(len(chunk))], skip_special_tokens=True
        )
        correct += sum(reward(text, problem.answer) for text, problem in zip(texts, chunk, strict=True))
    model.train(was_training)
    return correct / len(problems)


class _GreedyModel:
    """The token-in, token-out engine contract over a bare model: greedy turns, version 0."""

    version = 0

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.prefix = PrefixCache(PREFIX_CACHE_BYTES)  # the weights stay as they are for its life

    def generate_ids(
        self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = True
    ) -> list[TurnSample]:
        batch = sample(
            self.model,
            contexts,
            max_new_tokens=max_new_tokens,
            eos_id=self.tokenizer.eos_token_id,
            pad_id=self.tokenizer.pad_token_id,
            greedy=True,
            prefix=self.prefix,
        )
        return [
            TurnSample(
                batch.tokens[row, : batch.lengths[row]],
                batch.logprobs[row, : batch.lengths[row]],
                bool(batch.stopped[row]),
            )
            for row in range(len(contexts))
        ]


def evaluation_task(problem: Problem, workflow: str) -> RolloutTask:
    """A held-out row as the one-episode task an environment is built from."""
    return RolloutTask(
        f"{problem.prompt_id}@eval",
        problem.prompt_id,
        f"{problem.prompt_id}@eval",
        workflow,
        problem.prompt,
        problem.answer,
        1,
        0,
        0,
    )


def evaluate_episodes(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    make_env: EnvFactory,
    limits: AgentLimits,
    *,
    workflow: str = "eval",
    batch_size: int = 256,
) -> float:
    """Mean reward of one greedy episode per problem (for 0/1 rewards, the success rate).

    An environment that fails raises its error: a broken evaluation is not a score of 0.
    """
    was_training = model.training
    model.eval()
    engine = _GreedyModel(model, tokenizer)
    total = 0.0
    try:
        for start in range(0, len(problems), batch_size):
            tasks = [evaluation_task(problem, workflow) for problem in problems[start : start + batch_size]]
            episodes, failed = play(engine, tasks, make_env, limits, temperature=1.0, greedy=True)
            if failed:
                raise next(iter(failed.values()))
            total += sum(episode.score["reward"] for episode in episodes)
    finally:
        model.train(was_training)
    return total / len(problems)
