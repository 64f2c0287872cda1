"""Programs from input/output examples: the code task, scored by tests run in the sandbox.

A hidden integer function (``n*3+1``, ``n*n+4``, ``n%5``, ``n//3+2`` …) is shown by three examples,
``"f(2)=7 f(5)=16 f(0)=1\\n"``; the policy writes a Python program that reads ``n`` from stdin and
prints ``f(n)``. The reference (a JSON string) holds five tests, the three shown plus two hidden,
and one solution, which only warm-up demonstrations use; the reward is the fraction of tests the
program passes in the sandbox (``astraflow.envs.code``). The constant functions (``f(n)=42``, a
little over a quarter of the problems) are the easy slice a tiny model solves by copying, so its
rewards vary from the start; the others take arithmetic.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from astraflow.tasks.arithmetic import Problem

FAMILIES: dict[str, tuple[Callable[[int, int, int], int], str, list[tuple[int, int]]]] = {
    "const": (lambda n, a, b: b, "{b}", [(0, b) for b in range(100)]),
    "lin": (lambda n, a, b: n * a + b, "n*{a}+{b}", [(a, b) for a in range(1, 10) for b in range(20)]),
    "sq": (lambda n, a, b: n * n + b, "n*n+{b}", [(0, b) for b in range(20)]),
    "mod": (lambda n, a, b: n % a, "n%{a}", [(a, 0) for a in range(2, 10)]),
    "div": (lambda n, a, b: n // a + b, "n//{a}+{b}", [(a, b) for a in range(2, 10) for b in range(10)]),
}
SHOWN, TESTS = 3, 5


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
            inputs = rng.sample(range(21), TESTS)
            tests = [Test(f"{n}\n", f"{function(n, a, b)}\n") for n in inputs]
            shown = " ".join(f"f({n})={function(n, a, b)}" for n in inputs[:SHOWN])
            solution = f"n=int(input())\nprint({template.format(a=a, b=b)})\n"
            reference = json.dumps({"tests": [vars(t) for t in tests], "solution": solution})
            problems.append(Problem(prompt_id=f"prog-{family}-{a}-{b}", prompt=f"{shown}\n", answer=reference))
    if not 0 < heldout_size < len(problems):
        raise ValueError(f"heldout_size must be in (0, {len(problems)}), got {heldout_size}")
    rng.shuffle(problems)
    return problems[heldout_size:], problems[:heldout_size]
