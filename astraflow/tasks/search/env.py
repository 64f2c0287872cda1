"""The search tool as an environment: ``search(words)`` queries the index, ``answer(words)`` ends.

Observations are the top-k documents, one per line, between newlines (``\\nzorvex city paris\\n``);
the reward is exact match of the answer with the task's reference (the issue's "reward = exact
answer"); an episode that never answers scores 0. Role ``tool``.
"""

from __future__ import annotations

from astraflow.envs.base import EpisodeEnv, StepResult
from astraflow.envs.calls import parse_call
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.search.index import SearchIndex

USAGE = "\nwrite search(words) or answer(words).\n"


class SearchEnv(EpisodeEnv):
    role = "tool"

    def __init__(self, task: RolloutTask, index: SearchIndex, top_k: int = 1) -> None:
        self.task = task
        self.index = index
        self.top_k = top_k
        self.answer: str | None = None
        self.searches = 0

    def reset(self) -> str:
        return self.task.prompt

    def step(self, action: str) -> StepResult:
        call = parse_call(action)
        if call is not None and call.name == "answer":
            self.answer = call.argument
            return StepResult("", done=True)
        if call is None or call.name != "search":
            return StepResult(USAGE)
        self.searches += 1
        hits = self.index.search(call.argument, self.top_k)
        return StepResult("\n" + ("\n".join(hit.text for hit in hits) or "no results") + "\n")

    def reward(self) -> dict[str, float]:
        correct = float(self.answer is not None and self.answer == self.task.reference.strip())
        return {
            "reward": correct,
            "correct": correct,
            "answered": float(self.answer is not None),
            "searches": float(self.searches),
        }
