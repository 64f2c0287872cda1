"""Programs from input/output examples: the code task, scored by tests run in the sandbox.

A hidden integer function (``n*3+1``, ``n*n+4``, ``n%5``, ``n//3+2``, ``42`` …) is shown by its
values at 0, 1 and one more input, ``"f(0)=1 f(1)=4 f(7)=22\n"``; the policy writes a Python
program that reads ``n`` and prints ``f(n)``. The reference (a JSON string) holds five tests, the
three shown plus two hidden, and one solution, which only warm-up demonstrations use; the reward is
the fraction of tests the program passes in the sandbox (``astraflow.tasks.code.env``).

Showing f(0) and f(1) makes the problems learnable by a tiny model and their rewards graded: the
offset is f(0), copied; the slope of ``n*a+b`` is f(1) - f(0), a subtraction; and a program with
the right offset but the wrong slope still passes the f(0) test. There are ~1,700 problems, so the
warm-up cannot simply learn the training problems by heart (it did on the first ~400: rewards of a
whole group were then all 1 on training prompts, and dynamic sampling left nothing to train on).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from astraflow.tasks.base import Problem

FAMILIES: dict[str, tuple[Callable[[int, int, int], int], str, list[tuple[int, int]]]] = {
    "const": (lambda n, a, b: b, "{b}", [(0, b) for b in range(300)]),
    "lin": (lambda n, a, b: n * a + b, "n*{a}+{b}", [(a, b) for a in range(1, 10) for b in range(100)]),
    "sq": (lambda n, a, b: n * n + b, "n*n+{b}", [(0, b) for b in range(100)]),
    "mod": (lambda n, a, b: n % a, "n%{a}", [(a, 0) for a in range(2, 10)]),
    "div": (lambda n, a, b: n // a + b, "n//{a}+{b}", [(a, b) for a in range(2, 10) for b in range(50)]),
}
SHOWN, TESTS = 3, 5
DATA_VERSION = 2
"""Bumped whenever the generated problems change, so cached base checkpoints warmed up on older ones are not reused."""


@dataclass(frozen=True)
class Test:
    input: str
    output: str


def parse_reference(reference: str) -> tuple[list[Test], str]:
    """The tests and the solution held in a task's reference; ``ValueError`` if it is not one."""
    data = json.loads(reference)
    return [Test(str(t["input"]), str(t["output"])) for t in data["tests"]], str(data.get("solution", ""))


def demonstration(problem: Problem) -> list[str]:
    """The policy turns of a perfect episode (the warm-up's demonstration): the reference solution."""
    return [parse_reference(problem.answer)[1]]


def program_problems(seed: int, heldout_size: int) -> tuple[list[Problem], list[Problem]]:
    """Every (family, parameters) problem, with seeded test inputs, split into (train, held-out)."""
    rng = random.Random(seed)
    problems = []
    for family, (function, template, params) in FAMILIES.items():
        for a, b in params:
            inputs = [0, 1, *rng.sample(range(2, 21), TESTS - 2)]  # shown: f(0), f(1) and one more
            tests = [Test(f"{n}\n", f"{function(n, a, b)}\n") for n in inputs]
            shown = " ".join(f"f({n})={function(n, a, b)}" for n in inputs[:SHOWN])
            solution = f"n=int(input())\nprint({template.format(a=a, b=b)})\n"
            reference = json.dumps({"tests": [vars(t) for t in tests], "solution": solution})
            problems.append(Problem(prompt_id=f"prog-{family}-{a}-{b}", prompt=f"{shown}\n", answer=reference))
    if not 0 < heldout_size < len(problems):
        raise ValueError(f"heldout_size must be in (0, {len(problems)}), got {heldout_size}")
    rng.shuffle(problems)
    return problems[heldout_size:], problems[:heldout_size]
