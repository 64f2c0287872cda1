"""Curators: which prompts the task feeder submits (selective rollout), learned from PromptStats.

The stream processor writes one PromptStats per group, accepted or dropped, to the feedback
topic; the feeder passes each to ``observe`` and asks ``admit(prompt_id, n)`` before submitting
the run's n-th candidate. A curator's state is a function of the feedback it observed, in order,
and a decision a function of that state and (prompt, n) only - GRESO's draw included, which comes
from a hash of (seed, prompt, n), not from a generator whose position a restart would lose. So a
restarted feeder that reads the topic from the start decides every candidate as the crashed one
would have (``component.py``).

- ``accept_all``: every prompt.
- ``filter_solved``: an EWMA of each prompt's pass rate; a prompt above ``threshold`` is never
  submitted again (with no new rollouts its EWMA no longer moves).
- ``greso`` (Zheng et al. 2025, "Act Only When It Pays", GRESO): per prompt, the streak of
  consecutive zero-variance groups; submit with probability p_easy^streak after all-correct
  groups, p_hard^streak after all-wrong ones. After every ``adapt_every`` groups of feedback,
  each p moves by ``step`` down when its share of zero-variance groups was at or above its
  target, else up, within ``[p_min, p_max]``. Departure: GRESO adapts once per training step
  over that step's rollouts; a feeder does not see training steps, so it adapts per window of
  feedback groups (set ``adapt_every`` to the groups in one batch).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from astraflow.config import AcceptAllCurator, CuratorSpec, FilterSolvedCurator, GresoCurator
from astraflow.schemas.records import PromptStats

_ZERO_STD = 1e-9


class Curator(Protocol):
    name: str

    def observe(self, stats: PromptStats) -> None:
        """Learn from the outcome of one group."""

    def admit(self, prompt_id: str, candidate: int) -> bool:
        """Whether to submit ``prompt_id`` as the run's candidate number ``candidate``."""


class AcceptAll:
    name = "accept_all"

    def observe(self, stats: PromptStats) -> None:
        return None

    def admit(self, prompt_id: str, candidate: int) -> bool:
        return True


class FilterSolved:
    """Stops submitting a prompt once the EWMA of its pass rate exceeds ``threshold``."""

    name = "filter_solved"

    def __init__(self, threshold: float = 0.95, alpha: float = 0.5, min_groups: int = 1) -> None:
        self.threshold = threshold
        self.alpha = alpha
        self.min_groups = min_groups
        self.pass_rate: dict[str, float] = {}  # EWMA per prompt
        self.groups: dict[str, int] = {}

    def observe(self, stats: PromptStats) -> None:
        previous = self.pass_rate.get(stats.prompt_id)
        new = stats.pass_rate if previous is None else self.alpha * stats.pass_rate + (1 - self.alpha) * previous
        self.pass_rate[stats.prompt_id] = new
        self.groups[stats.prompt_id] = self.groups.get(stats.prompt_id, 0) + 1

    def admit(self, prompt_id: str, candidate: int) -> bool:
        solved = self.pass_rate.get(prompt_id, 0.0) > self.threshold
        return not (solved and self.groups.get(prompt_id, 0) >= self.min_groups)


class Greso:
    """Skips prompts whose recent groups all got the same reward, with probability 1 − p^streak."""

    name = "greso"

    def __init__(
        self,
        p_easy: float = 0.5,
        p_hard: float = 0.5,
        target_easy: float = 0.083,
        target_hard: float = 0.167,
        step: float = 0.01,
        p_min: float = 0.05,
        p_max: float = 0.95,
        adapt_every: int = 64,
        seed: int = 0,
    ) -> None:
        self.p = {"easy": p_easy, "hard": p_hard}
        self.target = {"easy": target_easy, "hard": target_hard}
        self.step, self.p_min, self.p_max, self.adapt_every = step, p_min, p_max, adapt_every
        self.streaks: dict[str, tuple[str, int]] = {}  # prompt → (easy | hard, consecutive zero-variance groups)
        self._window = {"groups": 0, "easy": 0, "hard": 0}
        self.seed = seed

    def observe(self, stats: PromptStats) -> None:
        self._window["groups"] += 1
        if stats.reward_std > _ZERO_STD:
            self.streaks.pop(stats.prompt_id, None)
        else:
            kind = "easy" if stats.pass_rate >= 1.0 else "hard"
            self._window[kind] += 1
            previous, streak = self.streaks.get(stats.prompt_id, (kind, 0))
            self.streaks[stats.prompt_id] = (kind, streak + 1 if previous == kind else 1)
        if self._window["groups"] >= self.adapt_every:
            self._adapt()

    def _adapt(self) -> None:
        groups = self._window["groups"]
        for kind in ("easy", "hard"):
            if self._window[kind] / groups >= self.target[kind]:
                self.p[kind] = max(self.p[kind] - self.step, self.p_min)
            else:
                self.p[kind] = min(self.p[kind] + self.step, self.p_max)
        self._window = {"groups": 0, "easy": 0, "hard": 0}

    def probability(self, prompt_id: str) -> float:
        """The probability that ``admit`` submits the prompt now: p_kind^streak (1 without a streak)."""
        kind, streak = self.streaks.get(prompt_id, ("easy", 0))
        return self.p[kind] ** streak

    def admit(self, prompt_id: str, candidate: int) -> bool:
        return self.draw(prompt_id, candidate) < self.probability(prompt_id)

    def draw(self, prompt_id: str, candidate: int) -> float:
        """The uniform draw in [0, 1) for candidate ``candidate``: a hash of (seed, prompt, candidate)."""
        digest = hashlib.blake2b(f"{self.seed}/{prompt_id}/{candidate}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64


_CURATORS = {AcceptAllCurator: AcceptAll, FilterSolvedCurator: FilterSolved, GresoCurator: Greso}


def build_curator(spec: CuratorSpec) -> Curator:
    """The curator named by ``stream.curator``."""
    return _CURATORS[type(spec)](**spec.model_dump(exclude={"type"}))
