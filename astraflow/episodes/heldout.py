"""Greedy held-out scores, shared by the warm-up and the evaluators: exact match of one answer,
and the success rate of multi-turn episodes, and which of them a run config's workflow is scored by
(``heldout_scorer``).

Both score through the torch engine the rollout producers generate with (``TorchEngine``, greedy,
version 0 of whatever weights the model holds), and multi-turn episodes are played by
``astraflow.episodes.loop.play``, the loop the producers' workflows use: how a policy plays a task is
written once, for rollouts and evaluations alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.config import RunConfig
from astraflow.core.rundir import RunDir
from astraflow.engines.torch_engine import TorchEngine
from astraflow.envs.base import EnvFactory
from astraflow.episodes.loop import AgentLimits, play
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.arithmetic import exact_match_reward, judge_reward
from astraflow.tasks.base import Problem
from astraflow.tasks.catalog import is_multi_turn, open_environments


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
    engine = TorchEngine(model, tokenizer, prefix_cache_bytes=0)  # sets eval mode
    correct = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        turns = engine.sample(engine.encode([problem.prompt for problem in chunk]), 1, max_new_tokens, 1.0, greedy=True)
        texts = tokenizer.batch_decode([turn.ids for turn in turns], skip_special_tokens=True)
        correct += sum(reward(text, problem.answer) for text, problem in zip(texts, chunk, strict=True))
    model.train(was_training)
    return correct / len(problems)


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
    engine = TorchEngine(model, tokenizer)  # sets eval mode; its prefix cache lives as long as these weights
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


def heldout_scorer(
    config: RunConfig,
    run_dir: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
) -> Callable[[], float]:
    """What one evaluation of ``config``'s policy computes: ``score()`` → the greedy success rate of
    one episode per problem for a multi-turn workflow (in the environments its producers open), else
    exact match of one answer (a judge's: its judgement), of whatever weights ``model`` holds then."""
    r = config.rollout
    if is_multi_turn(r.workflow):
        make_env = open_environments(r.workflow, r.reward, config.agent, RunDir(run_dir).data)
        limits = AgentLimits.from_config(config.agent, r.max_new_tokens)
        return lambda: evaluate_episodes(model, tokenizer, problems, make_env, limits, workflow=r.workflow)
    reward = judge_reward if config.role == "judge" else exact_match_reward
    return lambda: evaluate_exact_match(model, tokenizer, problems, max_new_tokens=r.max_new_tokens, reward=reward)
