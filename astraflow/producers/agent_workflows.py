"""The multi-turn workflows named by ``rollout.workflow``: which environment each episode gets.

- ``search``: ``SearchEnv`` over the BM25 index of ``agent.corpus_file`` (default: the corpus the
  ``search_facts`` task generated, ``{data_dir}/corpus.jsonl``); reward ``exact_match``.
- ``code``: ``CodeEnv`` running each program in the sandbox of ``agent.sandbox``, which must work
  at start-up (``SandboxUnavailableError`` otherwise); reward ``tests_passed``.
- ``rooms``: the bundled room-navigation game in process; reward ``env``.
- ``http_env``: ``HttpEnv`` against ``agent.env_url``; reward ``env``.

Resources shared by every episode (the index, the sandbox) are opened once, here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from astraflow.config import AgentConfig
from astraflow.envs.base import EnvFactory
from astraflow.errors import ConfigError
from astraflow.producers.multiturn import AgentLimits, MultiTurnWorkflow


def _search_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.envs.search import SearchEnv
    from astraflow.tasks.facts import CORPUS_FILE
    from astraflow.tools.search import SearchIndex

    if agent.corpus_file is None and data_dir is None:
        raise ConfigError("agent.corpus_file: the search workflow needs a corpus (or the run's data directory)")
    corpus = Path(agent.corpus_file) if agent.corpus_file else data_dir / CORPUS_FILE
    if not corpus.is_file():
        raise ConfigError(f"agent.corpus_file: no corpus at {corpus} (the search_facts task writes one with its data)")
    index = SearchIndex.for_corpus(corpus)
    return lambda task, episode: SearchEnv(task, index, agent.search_top_k)


def _code_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.envs.code import CodeEnv
    from astraflow.sandbox import SandboxLimits, open_sandbox

    box = agent.sandbox
    limits = SandboxLimits(wall_seconds=box.wall_seconds, cpu_seconds=box.cpu_seconds, memory_mb=box.memory_mb, max_processes=box.max_processes, max_file_mb=box.max_file_mb)
    sandbox = open_sandbox(box.backend, limits, python=box.python)
    return lambda task, episode: CodeEnv(task, sandbox)


def _rooms_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.envs.rooms import RoomsEnv, layout_from_reference

    return lambda task, episode: RoomsEnv(layout_from_reference(task.reference))


def _http_envs(agent: AgentConfig, data_dir: Path | None) -> EnvFactory:
    from astraflow.envs.http import HttpEnv

    if not agent.env_url:
        raise ConfigError("agent.env_url: the http_env workflow needs the environment server's URL")
    return lambda task, episode: HttpEnv(agent.env_url, task, episode, agent.env_timeout_s)


WORKFLOWS: dict[str, tuple[str, Callable[[AgentConfig, Path | None], EnvFactory]]] = {
    "search": ("exact_match", _search_envs),
    "code": ("tests_passed", _code_envs),
    "rooms": ("env", _rooms_envs),
    "http_env": ("env", _http_envs),
}
"""Multi-turn workflow name → (the reward it is scored by, what builds its environments)."""


def build_agent_workflow(kind: str, policy: str, reward: str, max_new_tokens: int, temperature: float, agent: AgentConfig, data_dir: Path | None) -> MultiTurnWorkflow:
    """The multi-turn workflow ``kind``; ``ConfigError`` naming the field when the config cannot run it."""
    if kind not in WORKFLOWS:
        raise ConfigError(f"rollout.workflow: unknown workflow {kind!r}; choose 'single_turn' or one of {sorted(WORKFLOWS)}")
    scored_by, environments = WORKFLOWS[kind]
    if reward != scored_by:
        raise ConfigError(f"rollout.reward: workflow {kind!r} is scored by {scored_by!r}, not {reward!r}")
    limits = AgentLimits(
        max_turns=agent.max_turns,
        max_new_tokens=max_new_tokens,
        max_total_tokens=agent.max_total_tokens,
        max_observation_tokens=agent.max_observation_tokens,
        max_tool_seconds=agent.max_tool_seconds,
        tool_workers=agent.tool_workers,
    )
    return MultiTurnWorkflow(policy, environments(agent, data_dir), limits, temperature)
