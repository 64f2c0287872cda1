"""Multi-turn workflows: policy turns alternate with environment / tool turns, token-exact.

A ``MultiTurnWorkflow`` plays ``group_size`` episodes per task, each against its own
``EpisodeEnv``, with ``astraflow.episodes.loop.play`` (the loop, its limits and its token-exactness
are documented there), and turns every scored episode into a Trajectory: the prompt ids, the
response as the concatenation of its turns (policy tokens with their behaviour log-probs, loss
mask 1; environment tokens with log-prob 0, loss mask 0), the version of every token and the
turn structure. A task whose environment failed, or scored no finite reward, is failed whole
(dead-lettered by the producer), never scored 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from astraflow.config import AgentConfig
from astraflow.engines.base import Engine
from astraflow.envs.base import EnvFactory
from astraflow.episodes.loop import AgentLimits, play
from astraflow.episodes.workflows.base import Provenance, TaskOutcome, Workflow, make_trajectory
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.catalog import Environments, open_environments


class MultiTurnWorkflow(Workflow):
    """One policy against one environment per episode; its episodes resume from recorded turns."""

    resumes = True

    def __init__(
        self, policy: str, make_env: EnvFactory, limits: AgentLimits, temperature: float, greedy: bool = False
    ) -> None:
        self.policies = (policy,)
        self.policy = policy
        self.make_env = make_env
        self.limits = limits
        self.temperature = temperature
        self.greedy = greedy

    def open(self) -> None:
        if isinstance(self.make_env, Environments):
            self.make_env.open()

    def run_batch(
        self, engines: Mapping[str, Engine], tasks: list[RolloutTask], provenance: Provenance
    ) -> list[TaskOutcome]:
        engine = engines[self.policy]
        episodes, failed = play(
            engine, tasks, self.make_env, self.limits, self.temperature, self.greedy, journal=self.journal
        )
        outcomes = [TaskOutcome(task) for task in tasks]
        for pos, error in failed.items():
            outcomes[pos].error = error
        for episode in episodes:
            if episode.task_pos not in failed:
                text = engine.tokenizer.decode(episode.transcript.arrays()[0], skip_special_tokens=False)
                outcomes[episode.task_pos].trajectories.append(
                    make_trajectory(
                        tasks[episode.task_pos],
                        episode.index,
                        self.policy,
                        episode.transcript,
                        episode.score,
                        episode.finish_reason or "stop",
                        text,
                        provenance,
                        generate_ms=episode.generate_ms,
                        reward_ms=episode.tool_seconds * 1000,
                        producers=episode.producers,
                        resumes=episode.resumes,
                    )
                )
        return outcomes


def build_multi_turn_workflow(
    kind: str,
    policy: str,
    reward: str,
    max_new_tokens: int,
    temperature: float,
    agent: AgentConfig,
    data_dir: Path | None,
) -> MultiTurnWorkflow:
    """The multi-turn workflow ``kind`` (``search``, ``code``, ``rooms``, ``http_env``): environments
    from ``astraflow.tasks.catalog``, limits from ``agent`` and ``rollout.max_new_tokens``;
    ``ConfigError`` naming the field when the config cannot run it."""
    make_env = open_environments(kind, reward, agent, data_dir)
    return MultiTurnWorkflow(policy, make_env, AgentLimits.from_config(agent, max_new_tokens), temperature)
