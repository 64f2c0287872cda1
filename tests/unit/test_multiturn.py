"""The multi-turn workflow loop with a scripted policy: turns, masks, limits, failures, config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from astraflow.basemodel.tiny import build_char_tokenizer
from astraflow.config import AgentConfig
from astraflow.core.errors import ConfigError, RewardError
from astraflow.envs.base import EnvError, EpisodeEnv, StepResult
from astraflow.envs.server import EnvServer
from astraflow.episodes.loop import AgentLimits
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.factory import build_workflow
from astraflow.episodes.workflows.multiturn import MultiTurnWorkflow
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.rooms.env import RoomsLayout
from astraflow.tasks.rooms.server import rooms_factory
from astraflow.tasks.search.facts import ALPHABET, fact_problems
from tests.unit.scripted_engine import ScriptedEngine

PROVENANCE = Provenance("rollout-test", "eu", "cpu")
TOKENIZER = build_char_tokenizer(ALPHABET)


def task(prompt: str, reference: str = "", group_size: int = 2, name: str = "t") -> RolloutTask:
    return RolloutTask(f"{name}@0", name, f"{name}@0", "agent", prompt, reference, group_size, 0, 0)


class EchoEnv(EpisodeEnv):
    """Answers every turn with ``observation``; done after ``done_after`` turns (never if None)."""

    def __init__(
        self,
        observation: str = "\nok\n",
        done_after: int | None = None,
        fail_on: str | None = None,
        reward: float = 1.0,
    ) -> None:
        self.observation, self.done_after, self.fail_on, self.score = observation, done_after, fail_on, reward
        self.steps, self.closed = 0, False

    def reset(self) -> str:
        return "start\n"

    def step(self, action: str) -> StepResult:
        if action == self.fail_on:
            raise EnvError("the environment broke")
        self.steps += 1
        return StepResult(self.observation, done=self.steps == self.done_after)

    def reward(self) -> dict[str, float]:
        return {"reward": self.score, "steps": float(self.steps)}

    def close(self) -> None:
        self.closed = True


def run(make_env, script, limits: AgentLimits, tasks: list[RolloutTask], version: int = 4):
    engine = ScriptedEngine(TOKENIZER, script, version=version)
    return MultiTurnWorkflow("main", make_env, limits, temperature=1.0).run_batch(
        {"main": engine}, tasks, PROVENANCE
    ), engine


def test_turns_alternate_with_masked_environment_spans() -> None:
    [outcome], engine = run(
        lambda t, i: EchoEnv(done_after=3), lambda ctx: "act", AgentLimits(max_turns=5), [task("start\n")]
    )
    for trajectory in outcome.trajectories:
        assert (
            trajectory.finish_reason == "stop"
            and trajectory.reward == 1.0
            and trajectory.reward_components["steps"] == 3.0
        )
        assert [t.role for t in trajectory.turns] == ["policy", "environment", "policy", "environment", "policy"]
        assert trajectory.response_text == "act<eos>\nok\nact<eos>\nok\nact<eos>"
        for turn in trajectory.turns:
            assert (trajectory.loss_mask[turn.start : turn.end] == (turn.role == "policy")).all()
            expected = -0.5 if turn.role == "policy" else 0.0
            assert (trajectory.behaviour_logprobs[turn.start : turn.end] == expected).all()
        assert (trajectory.token_versions == 4).all() and trajectory.min_version == 4
        assert trajectory.turns[-1].end == len(trajectory.response_ids) and trajectory.group_size == 2
    assert [t.trajectory_id for t in outcome.trajectories] == ["t@0/0", "t@0/1"]
    assert len(engine.contexts) == 6  # 3 rounds x 2 episodes, batched per round


@pytest.mark.parametrize(
    ("limits", "script", "env", "finish", "policy_turns"),
    [
        (AgentLimits(max_turns=2), lambda c: "act", {}, "turn_limit", 2),
        (AgentLimits(max_new_tokens=3), lambda c: "a long turn", {}, "length", 1),
        (AgentLimits(max_total_tokens=12), lambda c: "act", {}, "token_limit", 2),
        (AgentLimits(max_total_tokens=10), lambda c: "act", {}, "token_limit", 2),
        (AgentLimits(max_total_tokens=7), lambda c: "act", {}, "token_limit", 1),
        (AgentLimits(max_tool_seconds=1e-12), lambda c: "act", {}, "tool_time_limit", 1),
        (AgentLimits(max_turns=3), lambda c: "act", {"done_after": 1}, "stop", 1),
    ],
)
def test_episode_limits(limits: AgentLimits, script, env: dict, finish: str, policy_turns: int) -> None:
    [outcome], _ = run(lambda t, i: EchoEnv(**env), script, limits, [task("start\n", group_size=1)])
    [trajectory] = outcome.trajectories
    assert trajectory.finish_reason == finish
    assert sum(turn.role == "policy" for turn in trajectory.turns) == policy_turns
    assert len(trajectory.response_ids) <= limits.max_total_tokens


def test_long_observations_are_cut() -> None:
    [outcome], _ = run(
        lambda t, i: EchoEnv(observation="x" * 50, done_after=2),
        lambda c: "a",
        AgentLimits(max_observation_tokens=7),
        [task("s\n", group_size=1)],
    )
    [trajectory] = outcome.trajectories
    assert [t.end - t.start for t in trajectory.turns] == [2, 7, 2]


def test_a_broken_environment_fails_its_task_only_and_every_env_is_closed() -> None:
    envs: list[EchoEnv] = []

    def make_env(t: RolloutTask, i: int) -> EchoEnv:
        envs.append(EchoEnv(done_after=2, fail_on="boom" if t.prompt_id == "bad" and i == 1 else None))
        return envs[-1]

    def script(context: str) -> str:
        return "boom" if context.count("ok") == 1 else "fine"

    good, bad = task("s\n", name="good"), task("s\n", name="bad")
    outcomes, _ = run(make_env, script, AgentLimits(), [good, bad])
    assert outcomes[0].error is None and len(outcomes[0].trajectories) == 2
    assert isinstance(outcomes[1].error, EnvError) and outcomes[1].trajectories == []
    assert len(envs) == 4 and all(env.closed for env in envs)


class BatchedEchoEnv(EchoEnv):
    """EchoEnv whose turns the workflow hands over in chunks; records each chunk's size."""

    batch_steps = True
    chunks: list[int] = []

    @classmethod
    def step_many(cls, envs, actions):
        cls.chunks.append(len(envs))
        return super().step_many(envs, actions)


def test_an_environment_with_batch_steps_gets_its_turns_in_one_chunk_per_worker() -> None:
    tasks = [task("start\n", group_size=3, name=f"t{i}") for i in range(3)]
    limits = AgentLimits(max_turns=5, tool_workers=2)
    script = lambda context: "act" if context.count("ok") < 2 else "stop"  # noqa: E731
    alone, _ = run(lambda t, i: EchoEnv(done_after=2 + (i == 0)), script, limits, tasks)
    BatchedEchoEnv.chunks = []
    together, _ = run(lambda t, i: BatchedEchoEnv(done_after=2 + (i == 0)), script, limits, tasks)
    assert BatchedEchoEnv.chunks == [5, 4, 5, 4, 2]  # 9 episodes in 2 chunks, twice; then 2 + 1 (a plain step)
    assert [[t.response_text for t in o.trajectories] for o in together] == [
        [t.response_text for t in o.trajectories] for o in alone
    ]
    assert all(
        t.reward_components["steps"] == 2 + (t.trajectory_id.endswith("/0")) for o in together for t in o.trajectories
    )


def test_a_chunk_whose_environment_breaks_fails_the_tasks_of_its_episodes() -> None:
    def make_env(t: RolloutTask, i: int) -> BatchedEchoEnv:
        return BatchedEchoEnv(done_after=2, fail_on="fine" if t.prompt_id == "bad" else None)

    script = lambda context: "fine"  # noqa: E731
    tasks = [task("s\n", name=name) for name in ("bad", "good", "fine", "also fine")]
    outcomes, _ = run(make_env, script, AgentLimits(tool_workers=2), tasks)
    assert [o.error is None for o in outcomes] == [False, False, True, True]  # "good" shared the chunk of "bad"


@pytest.mark.parametrize("reward", [float("nan"), float("inf")])
def test_a_non_finite_reward_fails_the_task(reward: float) -> None:
    [outcome], _ = run(lambda t, i: EchoEnv(done_after=1, reward=reward), lambda c: "a", AgentLimits(), [task("s\n")])
    assert isinstance(outcome.error, RewardError) and outcome.trajectories == []


def test_an_empty_prompt_fails_the_task() -> None:
    class Silent(EchoEnv):
        def reset(self) -> str:
            return ""

    [outcome], _ = run(lambda t, i: Silent(), lambda c: "a", AgentLimits(), [task("")])
    assert isinstance(outcome.error, EnvError)


def test_search_workflow_end_to_end(tmp_path: Path) -> None:
    train, _ = fact_problems(seed=0, heldout_size=20, data_dir=tmp_path, entities=20)
    problem = train[0]
    attribute, entity = problem.prompt[:-2].split(" of ")

    def script(context: str) -> str:
        last = context.rstrip("\n").split("\n")[-1]
        return f"search({entity} {attribute})" if last.endswith("?") else f"answer({last.split()[-1]})"

    workflow = build_workflow("search", "main", "exact_match", 32, 1.0, AgentConfig(), tmp_path)
    [outcome] = workflow.run_batch(
        {"main": ScriptedEngine(TOKENIZER, script)}, [task(problem.prompt, problem.answer)], PROVENANCE
    )
    for trajectory in outcome.trajectories:
        assert trajectory.reward == 1.0 and [t.role for t in trajectory.turns] == ["policy", "tool", "policy"]
        assert (
            trajectory.response_text == f"search({entity} {attribute})<eos>\n{entity} {attribute} {problem.answer}\n"
            f"answer({problem.answer})<eos>"
        )


@pytest.mark.parametrize("via_http", [False, True])
def test_rooms_workflow_locally_and_over_http(via_http: bool) -> None:
    layout = RoomsLayout.generate(7, 3)
    moves = iter(layout.shortest_path() * 2)
    server = EnvServer(rooms_factory).start() if via_http else None
    try:
        agent = AgentConfig(
            max_turns=10, max_total_tokens=1000, max_observation_tokens=200, env_url=server.url if server else None
        )
        workflow = build_workflow("http_env" if via_http else "rooms", "main", "env", 16, 1.0, agent)
        rooms = task("", json.dumps({"seed": 7, "size": 3}), group_size=1)
        [outcome] = workflow.run_batch(
            {"main": ScriptedEngine(TOKENIZER, lambda c: f"go({next(moves)})")}, [rooms], PROVENANCE
        )
    finally:
        if server:
            server.stop()
    [trajectory] = outcome.trajectories
    assert trajectory.reward == 1.0 and trajectory.finish_reason == "stop"
    assert sum(t.role == "policy" for t in trajectory.turns) == len(layout.shortest_path())
    assert TOKENIZER.decode(trajectory.prompt_ids).startswith("find the key. you are in the")


@pytest.mark.parametrize(
    ("kind", "reward", "agent", "field"),
    [
        ("code", "exact_match", AgentConfig(), "rollout.reward"),
        ("search", "env", AgentConfig(), "rollout.reward"),
        ("http_env", "env", AgentConfig(), "agent.env_url"),
        ("search", "exact_match", AgentConfig(corpus_file="/nonexistent/corpus.jsonl"), "agent.corpus_file"),
        ("tool_use", "env", AgentConfig(), "rollout.workflow"),
    ],
)
def test_workflow_config_errors_name_the_field(kind: str, reward: str, agent: AgentConfig, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_workflow(kind, "main", reward, 8, 1.0, agent).open()


def test_config_accepts_the_agent_section() -> None:
    from astraflow.config import parse_config

    config = parse_config(
        {
            "task": {"kind": "rooms"},
            "rollout": {"workflow": "rooms", "reward": "env"},
            "agent": {"max_turns": 6, "sandbox": {"backend": "bwrap", "memory_mb": 128}},
        }
    )
    assert config.agent.max_turns == 6 and config.agent.sandbox.memory_mb == 128
    with pytest.raises(ConfigError, match="agent.max_turns"):
        parse_config({"agent": {"max_turns": 0}})
    assert np.isclose(config.agent.max_tool_seconds, 30.0)
