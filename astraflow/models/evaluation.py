"""Greedy held-out exact match, shared by the warm-up and the evaluator.

Lives beside the model code rather than in a component so that the supervised warm-up (a trainer)
and the evaluator both use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.models.sampling import sample
from astraflow.tasks.arithmetic import Problem, exact_match_reward


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
