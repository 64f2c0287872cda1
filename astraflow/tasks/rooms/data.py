"""Room-navigation games as dataset rows: one seeded layout per prompt (``astraflow.tasks.rooms.env``).

The prompt is the game's first observation and the reference the layout's ``{"seed", "size"}``
JSON, from which the environment (local, or behind the HTTP adapter) rebuilds the game.
"""

from __future__ import annotations

import json

from astraflow.tasks.base import Problem
from astraflow.tasks.rooms.env import RoomsEnv, RoomsLayout, layout_from_reference

DATA_VERSION = 2
"""Bumped whenever the game changes (2: the back door marked, warmer or colder after each move), so
cached base checkpoints warmed up on an older game are not reused."""


def room_problems(
    seed: int, heldout_size: int, games: int = 2000, size: int = 3
) -> tuple[list[Problem], list[Problem]]:
    """``games`` layouts (seeds ``seed * games + i``), split into (train, held-out)."""
    if not 0 < heldout_size < games:
        raise ValueError(f"heldout_size must be in (0, {games}), got {heldout_size}")
    problems = []
    for index in range(games):
        layout_seed = seed * games + index
        prompt = RoomsEnv(RoomsLayout.generate(layout_seed, size)).reset()
        problems.append(
            Problem(
                prompt_id=f"rooms-{size}-{layout_seed}",
                prompt=prompt,
                answer=json.dumps({"seed": layout_seed, "size": size}),
            )
        )
    return problems[heldout_size:], problems[:heldout_size]


def demonstration(problem: Problem) -> list[str]:
    """The policy turns of a perfect episode (the warm-up's demonstration): the shortest path to
    the key. It walks straight there, which the policy, seeing one room at a time, cannot know;
    the warm-up teaches the move syntax and a prior, RL the exploring."""
    return [f"go({direction})" for direction in layout_from_reference(problem.answer).shortest_path()]
