"""Two-digit addition: a deterministic dataset and its exact-match reward.

Prompts look like ``"12+35="`` and answers like ``"47"``; both operands are in [10, 99], so there are
8,100 problems and answers have two or three digits. The split is a seeded shuffle, so the same seed
gives the same train/held-out files on every machine. The files are jsonl with one
``{"prompt_id", "prompt", "answer"}`` object per line (``tasks/base.py``), the format the task feeder reads.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from astraflow.core.errors import RewardError
from astraflow.tasks.base import Problem

ALPHABET = "0123456789+-*/=()<>?., \n"
"""The characters of the tiny model's tokenizer for this task (``astraflow.basemodel.tiny``)."""

OPERAND_RANGE = range(10, 100)


def addition_problems(seed: int = 0, heldout_size: int = 500) -> tuple[list[Problem], list[Problem]]:
    """All 8,100 two-digit additions, shuffled by ``seed`` and split into (train, held-out)."""
    problems = [
        Problem(prompt_id=f"add-{a}-{b}", prompt=f"{a}+{b}=", answer=str(a + b))
        for a in OPERAND_RANGE
        for b in OPERAND_RANGE
    ]
    if not 0 < heldout_size < len(problems):
        raise ValueError(f"heldout_size must be in (0, {len(problems)}), got {heldout_size}")
    random.Random(seed).shuffle(problems)
    return problems[heldout_size:], problems[:heldout_size]


def extract_answer(response_text: str) -> str:
    """The response up to its first newline (eos is already stripped by decoding), without spaces."""
    return response_text.split("\n", 1)[0].strip()


def exact_match_reward(response_text: str, answer: str) -> float:
    """1.0 when the extracted answer equals ``answer`` exactly, else 0.0.

    Malformed output ("4 7", "047", "") is a wrong answer and scores 0. Inputs that are not
    strings mean the caller is broken, not the model: that raises ``RewardError`` instead of
    silently scoring 0.
    """
    if not isinstance(response_text, str) or not isinstance(answer, str):
        raise RewardError(
            f"exact_match_reward needs two strings, got {type(response_text).__name__} and {type(answer).__name__}"
        )
    return 1.0 if extract_answer(response_text) == answer.strip() else 0.0


def judge_problems(problems: Iterable[Problem], seed: int = 0) -> list[Problem]:
    """Judging rows: ``"12+35=47?"`` with reference ``"47|47"`` (right), ``"12+35=45?"`` with ``"47|45"`` (wrong).

    About half the candidates are wrong, off by a small amount (±1, ±2, ±10), the kind of slip a
    partly trained answerer makes. The reference is ``answer|candidate`` (``judge_reference``).
    """
    rng = random.Random(seed)
    rows = []
    for problem in problems:
        candidate = problem.answer
        if rng.random() >= 0.5:
            candidate = (
                str(int(problem.answer) + rng.choice((-10, -2, -1, 1, 2, 10)))
                if problem.answer.isdigit()
                else problem.answer + "0"
            )
        rows.append(
            Problem(
                f"{problem.prompt_id}?{candidate}",
                judge_prompt(problem.prompt, candidate),
                judge_reference(problem.answer, candidate),
            )
        )
    return rows


def judge_prompt(prompt: str, candidate: str) -> str:
    """What a judging policy sees: the task's prompt, a candidate answer and ``?``."""
    return f"{prompt}{candidate}?"


def judge_reference(answer: str, candidate: str) -> str:
    """The reference of a judging task: the right answer and the candidate judged."""
    return f"{answer}|{candidate}"


def judgement(response_text: str, candidate: str) -> bool:
    """A judge's verdict on ``candidate``: it accepts when the answer it writes is the candidate.

    The judge is generative: it answers the prompt itself, seeing the candidate, and the verdict is
    the comparison. A tiny model does not learn a bare ``1``/``0`` verdict (measured on the 4x128
    model: supervised judging stays at chance for 1,000 steps of 64, from scratch or from the
    answerer's base), while it learns to answer as the answerer does.
    """
    return extract_answer(response_text) == candidate.strip()


def judge_reward(response_text: str, reference: str) -> float:
    """1.0 when the judge's verdict on the candidate equals whether the candidate is right (``answer|candidate``)."""
    if not isinstance(response_text, str) or not isinstance(reference, str) or "|" not in reference:
        raise RewardError(f"judge_reward needs a response and an 'answer|candidate' reference, got {reference!r}")
    answer, candidate = reference.split("|", 1)
    return 1.0 if judgement(response_text, candidate) == (candidate == answer) else 0.0


def judge_target(reference: str) -> str:
    """What a judge is supervised to write during warm-up: the right answer."""
    return reference.split("|", 1)[0]
