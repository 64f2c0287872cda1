"""The environments behind each multi-turn ``rollout.workflow``, and the reward each is scored by.

- ``search``: ``SearchEnv`` over the BM25 index of ``agent.corpus_file`` (default: the corpus the
  ``search_facts`` task generated, ``{data_dir}/corpus.jsonl``); reward ``exact_match``.
- ``code``: ``CodeEnv`` running each program in the sandbox of ``agent.sandbox``, which must work
  at start-up (``SandboxUnavailableError`` otherwise); reward ``tests_passed``.
- ``rooms``: the bundled room-navigation game in process; reward ``env``.
- ``http_env``: ``HttpEnv`` against ``agent.env_url`` (a host on ``agent.env_allowed_hosts``, checked
  when the config is loaded), within ``agent.env_timeout_s`` and ``env_max_response_bytes``; reward ``env``.

Resources shared by every episode (the index, the sandbox) are opened once, on first use or by
``Environments.open`` (rollout producers open them at start-up, so a missing corpus or a broken
sandbox stops them there; the task feeder, which only asks a workflow which policies it involves,
never opens them). Rollout producers, the warm-up and the evaluator all build their environments
here, so they play the same game.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from astraflow.config import AgentConfig
from astraflow.core.errors import ConfigError
from astraflow.envs.base import EnvFactory, EpisodeEnv
from astraflow.schemas.records import RolloutTask


def _search_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.tasks.search.env import SearchEnv
    from astraflow.tasks.search.facts import CORPUS_FILE
    from astraflow.tasks.search.index import SearchIndex

    if agent.corpus_file is None and data_dir is None:
        raise ConfigError("agent.corpus_file: the search workflow needs a corpus (or the run's data directory)")
    corpus = Path(agent.corpus_file) if agent.corpus_file else data_dir / CORPUS_FILE
    if not corpus.is_file():
        raise ConfigError(f"agent.corpus_file: no corpus at {corpus} (the search_facts task writes one with its data)")
    index = SearchIndex.for_corpus(corpus)
    return lambda task, episode: SearchEnv(task, index, agent.search_top_k)


def _code_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.sandbox import SandboxLimits, open_sandbox
    from astraflow.tasks.code.env import CodeEnv

    box = agent.sandbox
    limits = SandboxLimits(
        wall_seconds=box.wall_seconds,
        cpu_seconds=box.cpu_seconds,
        memory_mb=box.memory_mb,
        max_processes=box.max_processes,
        max_file_mb=box.max_file_mb,
        max_output_bytes=box.max_output_bytes,
    )
    sandbox = open_sandbox(box.backend, limits, python=box.python)
    return lambda task, episode: CodeEnv(task, sandbox)


def _rooms_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.tasks.rooms.env import RoomsEnv, layout_from_reference

    return lambda task, episode: RoomsEnv(layout_from_reference(task.reference))


def _http_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.envs.http import HttpEnv

    return lambda task, episode: HttpEnv(
        agent.env_url,
        task,
        episode,
        agent.env_timeout_s,
        max_response_bytes=agent.env_max_response_bytes,
        allowed_hosts=agent.env_allowed_hosts,
    )


ENVIRONMENTS: dict[str, tuple[str, Callable[[AgentConfig, Path | None], EnvFactory]]] = {
    "search": ("exact_match", _search_envs),
    "code": ("tests_passed", _code_envs),
    "rooms": ("env", _rooms_envs),
    "http_env": ("env", _http_envs),
}
"""Multi-turn workflow name → (the reward it is scored by, what builds its environments)."""


def is_multi_turn(workflow: str) -> bool:
    return workflow in ENVIRONMENTS


class Environments:
    """The ``EnvFactory`` of one workflow; its shared resources are opened once, on first use."""

    def __init__(self, workflow: str, agent: AgentConfig, data_dir: Path | None) -> None:
        self.workflow = workflow
        self._build = lambda: ENVIRONMENTS[workflow][1](agent, data_dir)
        self._factory: EnvFactory | None = None
        self._lock = threading.Lock()

    def open(self) -> EnvFactory:
        """Open the shared resources now (``ConfigError`` / ``SandboxUnavailableError`` if they cannot be)."""
        with self._lock:
            if self._factory is None:
                self._factory = self._build()
            return self._factory

    def __call__(self, task: RolloutTask, episode: int) -> EpisodeEnv:
        return self.open()(task, episode)


def open_environments(workflow: str, reward: str, agent: AgentConfig, data_dir: Path | None) -> Environments:
    """The environments of ``workflow``; ``ConfigError`` naming the field when the config cannot run them."""
    if workflow not in ENVIRONMENTS:
        raise ConfigError(
            f"rollout.workflow: unknown workflow {workflow!r}; choose 'single_turn' or one of {sorted(ENVIRONMENTS)}"
        )
    scored_by = ENVIRONMENTS[workflow][0]
    if reward != scored_by:
        raise ConfigError(f"rollout.reward: workflow {workflow!r} is scored by {scored_by!r}, not {reward!r}")
    if workflow == "http_env" and not agent.env_url:
        raise ConfigError("agent.env_url: the http_env workflow needs the environment server's URL")
    return Environments(workflow, agent, data_dir)
