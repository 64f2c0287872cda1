"""A small text room-navigation game: find the key in a grid of rooms joined by doors.

The layout is a pure function of ``(seed, size)``: ``size × size`` named rooms, doors along a
random spanning tree of the grid (so every room is reachable and paths are unique), a start room
and a key room. The policy sees only the room it is in and its exits, and moves with
``go(north|south|east|west)``; after each move the game marks the door it came in by (``back``) and
says whether the key is now fewer doors away (``warmer``) or more (``colder``). Reward 1 when it
reaches the key room, else 0.

    find the key. you are in the hall. exits: north, east.\\n  go(east)<eos>
    \\nyou are in the attic. exits: west (back). colder.\\n  go(west)<eos>  ...  \\nyou found the key in the study.\\n

The signal is what makes the game learnable by reinforcement and not by imitation. Without it the
policy can only explore blindly: within 8 moves a depth-first search in the best fixed order finds
the key in 0.82 of the layouts, and a walk that never steps straight back in 0.73, which is where a
warmed-up policy already is. With it, stepping back on ``colder`` and trying the next door finds the
key in all but a few. The warm-up's demonstrations walk the shortest path, so they only ever say
``warmer`` and never take the ``back`` door: that ``colder`` calls for exactly that door is never
shown, and only reward teaches it.
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import dataclass, field

from astraflow.envs.base import EnvError, EpisodeEnv, StepResult
from astraflow.envs.calls import parse_call

ROOM_NAMES = [
    "hall",
    "kitchen",
    "attic",
    "cellar",
    "study",
    "garden",
    "bath",
    "pantry",
    "porch",
    "library",
    "garage",
    "office",
    "den",
    "loft",
    "shed",
    "vault",
]
DIRECTIONS = {"north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0)}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
Cell = tuple[int, int]


def neighbour(cell: Cell, direction: str) -> Cell:
    """The cell one step from ``cell`` in ``direction``."""
    dx, dy = DIRECTIONS[direction]
    return cell[0] + dx, cell[1] + dy


@dataclass
class RoomsLayout:
    size: int
    names: dict[Cell, str]
    doors: set[frozenset[Cell]]
    start: Cell
    key: Cell

    @classmethod
    def generate(cls, seed: int, size: int = 3) -> "RoomsLayout":
        if not 2 <= size <= 4:
            raise ValueError(f"rooms size must be in [2, 4], got {size}")
        rng = random.Random(seed)
        cells = [(x, y) for y in range(size) for x in range(size)]
        names = dict(zip(cells, rng.sample(ROOM_NAMES, len(cells))))
        doors: set[frozenset[Cell]] = set()
        seen, stack = {cells[0]}, [cells[0]]
        while stack:  # randomised depth-first search: a spanning tree
            x, y = stack[-1]
            options = [
                (x + dx, y + dy)
                for dx, dy in DIRECTIONS.values()
                if (x + dx, y + dy) in names and (x + dx, y + dy) not in seen
            ]
            if not options:
                stack.pop()
                continue
            nxt = rng.choice(options)
            doors.add(frozenset({(x, y), nxt}))
            seen.add(nxt)
            stack.append(nxt)
        start, key = rng.sample(cells, 2)
        return cls(size, names, doors, start, key)

    def exits(self, cell: Cell) -> list[str]:
        return [d for d in DIRECTIONS if frozenset({cell, neighbour(cell, d)}) in self.doors]

    def describe(self, cell: Cell, back: str | None = None) -> str:
        """The room and its exits; ``back`` marks the door the player came in by."""
        exits = [f"{d} (back)" if d == back else d for d in self.exits(cell)]
        return f"you are in the {self.names[cell]}. exits: {', '.join(exits)}."

    def distances(self) -> dict[Cell, int]:
        """Doors between each room and the key room."""
        distance, queue = {self.key: 0}, deque([self.key])
        while queue:
            cell = queue.popleft()
            for direction in self.exits(cell):
                nxt = neighbour(cell, direction)
                if nxt not in distance:
                    distance[nxt] = distance[cell] + 1
                    queue.append(nxt)
        return distance

    def shortest_path(self) -> list[str]:
        """The moves from the start to the key (for warm-up demonstrations): on a tree, each one the
        door that is one nearer."""
        distance, cell, path = self.distances(), self.start, []
        while cell != self.key:
            path.append(next(d for d in self.exits(cell) if distance[neighbour(cell, d)] < distance[cell]))
            cell = neighbour(cell, path[-1])
        return path


def layout_from_reference(reference: str) -> RoomsLayout:
    """The layout named by a task reference ``{"seed": s, "size": n}``; ``EnvError`` when malformed."""
    try:
        spec = json.loads(reference)
        return RoomsLayout.generate(int(spec["seed"]), int(spec.get("size", 3)))
    except (ValueError, KeyError, TypeError) as exc:
        raise EnvError(f"rooms: bad task reference {reference!r}: {exc}") from exc


@dataclass
class RoomsEnv(EpisodeEnv):
    """One game; ``role`` environment, reward 1 for reaching the key."""

    layout: RoomsLayout
    cell: Cell = field(init=False)
    found: bool = False
    moves: int = 0
    invalid: int = 0
    back: str | None = None

    def __post_init__(self) -> None:
        self.cell = self.layout.start
        self.distance = self.layout.distances()

    def reset(self) -> str:
        self.cell, self.found, self.moves, self.invalid, self.back = self.layout.start, False, 0, 0, None
        return f"find the key. {self.layout.describe(self.cell)}\n"

    def step(self, action: str) -> StepResult:
        call = parse_call(action)
        if call is None or call.name != "go" or call.argument not in DIRECTIONS:
            self.invalid += 1
            return StepResult("\nwrite go(north), go(south), go(east) or go(west).\n")
        if call.argument not in self.layout.exits(self.cell):
            self.invalid += 1
            return StepResult(f"\nno door {call.argument}. {self.layout.describe(self.cell, self.back)}\n")
        before, self.cell = self.cell, neighbour(self.cell, call.argument)
        self.moves += 1
        if self.cell == self.layout.key:
            self.found = True
            return StepResult(f"\nyou found the key in the {self.layout.names[self.cell]}.\n", done=True)
        # on a tree every move changes the distance by one door
        signal = "warmer" if self.distance[self.cell] < self.distance[before] else "colder"
        self.back = OPPOSITE[call.argument]
        return StepResult(f"\n{self.layout.describe(self.cell, self.back)} {signal}.\n")

    def reward(self) -> dict[str, float]:
        return {
            "reward": float(self.found),
            "found": float(self.found),
            "moves": float(self.moves),
            "invalid": float(self.invalid),
        }
