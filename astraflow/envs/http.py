"""Adapter for environments served over HTTP (AgentBench-style ``reset`` / ``step``).

The protocol (JSON bodies, ``POST``; ``astraflow.envs.server`` serves it):

- ``/reset`` ``{"task": {"task_id", "prompt_id", "prompt", "reference", "metadata"}, "episode": i}``
  → ``{"session": str, "observation": str}``; the observation is the episode's prompt;
- ``/step`` ``{"session", "action": str}`` → ``{"observation": str, "done": bool, "reward": float,
  "info": {name: number}}``; ``reward`` and ``info`` are the episode's score so far;
- ``/close`` ``{"session"}`` → ``{}``.

Any transport failure, missed deadline, oversized, redirected, non-2xx or malformed answer raises
``EnvError``: the task fails and is dead-lettered with the reason (server text in it clipped); the
adapter never invents a reward. The requests go through ``JsonClient`` (``astraflow.envs.client``):
one deadline per request, a size cap, no redirects, no proxies, an allow-list of hosts.
"""

from __future__ import annotations

from collections.abc import Iterable

from astraflow.envs.base import EnvError, EpisodeEnv, StepResult
from astraflow.envs.client import DEFAULT_MAX_RESPONSE_BYTES, JsonClient, clip
from astraflow.schemas.records import RolloutTask


class HttpEnv(EpisodeEnv):
    """One episode on an environment server; ``EnvError`` at construction when ``base_url`` is not an
    http(s) URL whose host is on ``allowed_hosts`` (empty: its own host)."""

    def __init__(
        self,
        base_url: str,
        task: RolloutTask,
        episode: int,
        timeout_s: float = 10.0,
        *,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.client = JsonClient(base_url, timeout_s, max_response_bytes, allowed_hosts)
        self.base_url = self.client.base_url
        self.task = task
        self.episode = episode
        self.session: str | None = None
        self.score: dict[str, float] = {"reward": 0.0}

    def reset(self) -> str:
        task = {
            "task_id": self.task.task_id,
            "prompt_id": self.task.prompt_id,
            "prompt": self.task.prompt,
            "reference": self.task.reference,
            "metadata": self.task.metadata,
        }
        answer = self.client.post("/reset", {"task": task, "episode": self.episode})
        try:
            self.session = str(answer["session"])
            return str(answer["observation"])
        except KeyError as exc:
            raise EnvError(f"environment {self.base_url}/reset: the answer has no {clip(str(exc))}") from exc

    def step(self, action: str) -> StepResult:
        answer = self.client.post("/step", {"session": self.session, "action": action})
        try:
            info = {str(k): float(v) for k, v in dict(answer.get("info", {})).items()}
            self.score = info | {"reward": float(answer["reward"])}
            return StepResult(str(answer["observation"]), bool(answer["done"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise EnvError(f"environment {self.base_url}/step: malformed answer {clip(f'{answer!r}: {exc}')}") from exc

    def reward(self) -> dict[str, float]:
        return dict(self.score)

    def close(self) -> None:
        if self.session is not None:
            self.client.post("/close", {"session": self.session})
            self.session = None
