"""Adapter for environments served over HTTP (AgentBench-style ``reset`` / ``step``).

The protocol (JSON bodies, ``POST``; ``astraflow.envs.server`` serves it):

- ``/reset`` ``{"task": {"task_id", "prompt_id", "prompt", "reference", "metadata"}, "episode": i}``
  → ``{"session": str, "observation": str}``; the observation is the episode's prompt;
- ``/step`` ``{"session", "action": str}`` → ``{"observation": str, "done": bool, "reward": float,
  "info": {name: number}}``; ``reward`` and ``info`` are the episode's score so far;
- ``/close`` ``{"session"}`` → ``{}``.

Any transport failure, timeout, non-2xx answer or malformed body raises ``EnvError``: the task
fails and is dead-lettered with the reason; the adapter never invents a reward.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from astraflow.envs.base import EnvError, EpisodeEnv, StepResult
from astraflow.schemas.records import RolloutTask


class HttpEnv(EpisodeEnv):
    def __init__(self, base_url: str, task: RolloutTask, episode: int, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.task = task
        self.episode = episode
        self.timeout_s = timeout_s
        self.session: str | None = None
        self.score: dict[str, float] = {"reward": 0.0}

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise EnvError(f"environment {self.base_url}{path} answered {exc.code}: {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EnvError(f"environment {self.base_url}{path} failed: {exc}") from exc
        if not isinstance(answer, dict):
            raise EnvError(f"environment {self.base_url}{path} answered {type(answer).__name__}, not an object")
        return answer

    def reset(self) -> str:
        task = {
            "task_id": self.task.task_id,
            "prompt_id": self.task.prompt_id,
            "prompt": self.task.prompt,
            "reference": self.task.reference,
            "metadata": self.task.metadata,
        }
        answer = self._post("/reset", {"task": task, "episode": self.episode})
        try:
            self.session = str(answer["session"])
            return str(answer["observation"])
        except KeyError as exc:
            raise EnvError(f"environment {self.base_url}/reset: the answer has no {exc}") from exc

    def step(self, action: str) -> StepResult:
        answer = self._post("/step", {"session": self.session, "action": action})
        try:
            info = {str(k): float(v) for k, v in dict(answer.get("info", {})).items()}
            self.score = info | {"reward": float(answer["reward"])}
            return StepResult(str(answer["observation"]), bool(answer["done"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise EnvError(f"environment {self.base_url}/step: malformed answer {answer!r}: {exc}") from exc

    def reward(self) -> dict[str, float]:
        return dict(self.score)

    def close(self) -> None:
        if self.session is not None:
            self._post("/close", {"session": self.session})
            self.session = None
