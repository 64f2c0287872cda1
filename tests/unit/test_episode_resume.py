"""Resuming episodes from recorded turns (``episodes/resume.py``), with a scripted policy and a journal
kept in memory: a producer "killed" after its k-th round of turns, and another one that resumes.

The journal here stands in for the rollout producer's (``producers/rollout/episode_journal.py``, shown
with real processes and SIGKILL in ``tests/e2e/test_episode_resume.py``): it keeps what
``record`` was given as the producer's journal would have committed it, and raises ``Killed`` right
after the round it is told to, which ends ``play`` there like a kill after that commit.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from astraflow.basemodel.tiny import build_char_tokenizer
from astraflow.config import AgentConfig
from astraflow.envs.base import EpisodeEnv, StepResult
from astraflow.episodes.loop import AgentLimits, Episode
from astraflow.episodes.workflows.base import Provenance, make_trajectory
from astraflow.episodes.workflows.factory import build_workflow
from astraflow.episodes.workflows.multiturn import MultiTurnWorkflow
from astraflow.schemas.records import RolloutTask, Trajectory
from astraflow.tasks.code.programs import program_problems
from astraflow.tasks.search.facts import ALPHABET, fact_problems
from tests.unit.scripted_engine import ScriptedEngine

TOKENIZER = build_char_tokenizer(ALPHABET)
LIMITS = AgentLimits(max_turns=5, max_new_tokens=8, max_total_tokens=200)
FIRST, SECOND = Provenance("rollout-a", "eu", "cpu"), Provenance("rollout-b", "us", "cpu")


class Killed(Exception):
    """The producer died right after committing a round of turns."""


class Counter(EpisodeEnv):
    """Answers turn k with a text of k and the action (deterministic); done after 4 turns. With ``drift``,
    answers also depend on how many ``Counter`` episodes were started before (not deterministic)."""

    started = 0

    def __init__(self, seed: int, drift: bool = False) -> None:
        self.seed, self.steps = seed, 0
        self.drift = Counter.started if drift else 0
        Counter.started += 1

    def reset(self) -> str:
        return f"count {self.seed}\n"

    def step(self, action: str) -> StepResult:
        self.steps += 1
        return StepResult(f"\n{self.steps + self.drift} {action[:2]}\n", done=self.steps == 4)

    def reward(self) -> dict[str, float]:
        return {"reward": float(self.steps)}


class MemoryJournal:
    """The journal protocol of ``episodes.loop``, holding what it was given (module docstring)."""

    def __init__(self, provenance: Provenance, held: dict[str, Trajectory] | None = None, kill_after: int = 0):
        self.provenance, self.held, self.kill_after = provenance, dict(held or {}), kill_after
        self.rounds, self.resumed_episodes, self.generated = 0, 0, 0

    def recorded(self, task: RolloutTask, index: int) -> Trajectory | None:
        return self.held.get(f"{task.task_id}/{index}")

    def resumed(self, tasks: list[RolloutTask], episodes: list[Episode]) -> None:
        self.resumed_episodes += sum(1 for e in episodes if e.resumed_turns)
        self._keep(tasks, episodes)

    def record(self, tasks: list[RolloutTask], episodes: list[Episode]) -> None:
        self._keep(tasks, episodes)
        self.rounds += 1
        if self.rounds == self.kill_after:
            raise Killed

    def finished(self, episodes: list[Episode]) -> None:
        self.generated = sum(e.policy_turns - e.resumed_turns for e in episodes)

    def _keep(self, tasks: list[RolloutTask], episodes: list[Episode]) -> None:
        for e in episodes:
            task = tasks[e.task_pos]
            self.held[f"{task.task_id}/{e.index}"] = make_trajectory(
                task, e.index, "main", e.transcript, {"reward": 0.0}, "", "", self.provenance,
                generate_ms=e.generate_ms, reward_ms=e.tool_seconds * 1000, producers=e.producers, resumes=e.resumes,
            )  # fmt: skip


def task(seed: int) -> RolloutTask:
    return RolloutTask(f"t{seed}", f"p{seed}", f"t{seed}", "agent", "", "", 2, 0, 0)


def play(journal: MemoryJournal, version: int, drift: bool = False) -> tuple[list, ScriptedEngine]:
    engine = ScriptedEngine(TOKENIZER, lambda context: f"go {context.count(chr(10))}", version=version)
    workflow = MultiTurnWorkflow("main", lambda t, i: Counter(int(t.task_id[1:]) * 10 + i, drift), LIMITS, 1.0)
    workflow.journal = journal
    return workflow.run_batch({"main": engine}, [task(1), task(2)], journal.provenance), engine


def test_an_episode_resumes_from_its_last_recorded_turn_byte_for_byte() -> None:
    whole, _ = play(MemoryJournal(FIRST), version=4)
    killed = MemoryJournal(FIRST, kill_after=2)
    with pytest.raises(Killed):
        play(killed, version=4)
    assert len(killed.held) == 4 and all(len(r.turns) == 4 for r in killed.held.values())  # 2 policy turns each

    resumer = MemoryJournal(SECOND, held=killed.held)
    outcomes, engine = play(resumer, version=7)
    assert resumer.resumed_episodes == 4
    assert len(engine.contexts) == resumer.generated == 4 * 2  # turns 3 and 4 only: 1 and 2 were recorded
    for outcome, reference in zip(outcomes, whole, strict=True):
        for trajectory, played in zip(outcome.trajectories, reference.trajectories, strict=True):
            record = killed.held[trajectory.trajectory_id]
            cut = record.turns[-1].end
            assert trajectory.response_ids[:cut].tobytes() == record.response_ids.tobytes()
            assert trajectory.behaviour_logprobs[:cut].tobytes() == record.behaviour_logprobs.tobytes()
            assert trajectory.turns[: len(record.turns)] == record.turns
            assert set(trajectory.token_versions[:cut]) == {4} and set(trajectory.token_versions[cut:]) == {7}
            assert trajectory.min_version == 4  # the staleness filter sees the oldest turn
            assert np.array_equal(trajectory.response_ids, played.response_ids)  # the same episode as played whole
            assert (trajectory.resumes, trajectory.producers) == (1, ["rollout-a", "rollout-b"])
            assert (played.resumes, played.producers) == (0, [])


def test_a_resumed_episode_killed_again_keeps_counting() -> None:
    killed = MemoryJournal(FIRST, kill_after=1)
    with pytest.raises(Killed):
        play(killed, version=4)
    again = MemoryJournal(SECOND, held=killed.held, kill_after=1)
    with pytest.raises(Killed):
        play(again, version=5)
    record = again.held["t1/0"]
    assert (record.resumes, record.producers, len(record.turns)) == (1, ["rollout-a", "rollout-b"], 4)
    outcomes, _ = play(MemoryJournal(FIRST, held=again.held), version=6)
    trajectory = outcomes[0].trajectories[0]
    assert (trajectory.resumes, trajectory.producers) == (2, ["rollout-a", "rollout-b", "rollout-a"])
    assert [turn.version for turn in trajectory.turns if turn.role == "policy"] == [4, 5, 6, 6]


def test_an_environment_that_answers_otherwise_plays_the_episode_from_its_start() -> None:
    killed = MemoryJournal(FIRST, kill_after=2)
    with pytest.raises(Killed):
        play(killed, version=4, drift=True)
    resumer = MemoryJournal(SECOND, held=killed.held)
    outcomes, engine = play(resumer, version=7, drift=True)
    assert resumer.resumed_episodes == 0 and len(engine.contexts) == 4 * 4  # every turn generated again
    for outcome in outcomes:
        for trajectory in outcome.trajectories:
            assert set(trajectory.token_versions) == {7}
            assert (trajectory.resumes, trajectory.producers) == (1, ["rollout-a", "rollout-b"])


def scripts() -> dict:
    """A policy per bundled environment that takes several turns, varied by what it has seen."""
    moves = ["north", "east", "south", "west"]
    return {
        "rooms": lambda context: f"go({moves[len(context) % 4]})",
        "search": lambda context: f"search(e{len(context) % 7} colour)",
        "code": lambda context: f"print({len(context) % 5})",
    }


def bundled_task(kind: str, data_dir) -> RolloutTask:
    if kind == "rooms":
        return RolloutTask("r@0", "r", "r@0", "rooms", "", json.dumps({"seed": 3, "size": 3}), 2, 0, 0)
    if kind == "search":
        problem = fact_problems(seed=0, heldout_size=20, data_dir=data_dir, entities=20)[0][0]
    else:
        problem = program_problems(seed=0, heldout_size=16)[0][0]
    return RolloutTask(f"{kind}@0", problem.prompt_id, f"{kind}@0", kind, problem.prompt, problem.answer, 2, 0, 0)


@pytest.mark.parametrize("kind", ["rooms", "search", "code"])
def test_the_bundled_environments_answer_their_recorded_turns_alike(kind: str, tmp_path) -> None:
    """Each bundled environment resumes: given the recorded actions again, it answers alike, so a resumed
    episode ends as the same episode played whole (the scripted policy is deterministic)."""
    if kind == "code" and working_sandbox() is None:
        if os.environ.get("CI", "").lower() == "true":  # the test command installs bubblewrap
            pytest.fail("no sandbox backend works here")
        pytest.skip("no sandbox backend works here")
    reward = {"rooms": "env", "search": "exact_match", "code": "tests_passed"}[kind]
    agent = AgentConfig(max_turns=4, max_total_tokens=400, max_observation_tokens=120, tool_workers=1)
    problem = bundled_task(kind, tmp_path)  # the search task writes its corpus with its data
    workflow = build_workflow(kind, "main", reward, 24, 1.0, agent, tmp_path)
    workflow.open()

    def played(journal: MemoryJournal, version: int) -> list[Trajectory]:
        workflow.journal = journal
        engine = ScriptedEngine(TOKENIZER, scripts()[kind], version=version)
        [outcome] = workflow.run_batch({"main": engine}, [problem], journal.provenance)
        assert outcome.error is None, outcome.error
        return outcome.trajectories

    whole = played(MemoryJournal(FIRST), 4)
    killed = MemoryJournal(FIRST, kill_after=1)
    with pytest.raises(Killed):
        played(killed, 4)
    assert killed.held, "some episode went on after its first turn"
    resumer = MemoryJournal(SECOND, held=killed.held)
    again = played(resumer, 7)
    assert resumer.resumed_episodes == len(killed.held)
    for trajectory, reference in zip(again, whole, strict=True):
        assert trajectory.response_ids.tobytes() == reference.response_ids.tobytes()
        assert [(t.role, t.start, t.end) for t in trajectory.turns] == [
            (t.role, t.start, t.end) for t in reference.turns
        ]
        assert trajectory.reward_components == reference.reward_components
        assert trajectory.resumes == (1 if trajectory.trajectory_id in killed.held else 0)


def working_sandbox():
    from astraflow.sandbox import BACKENDS, SandboxLimits, probe

    for cls in BACKENDS.values():
        if probe(cls(SandboxLimits(wall_seconds=2.0))) is None:
            return cls
    return None


def test_an_episode_resumed_max_resumes_times_fails_its_task_naming_it() -> None:
    """The producer's journal refuses a third resume (``agent.max_resumes``: 2): the task fails, and the
    producer dead-letters it (``send_outcome``) instead of playing an episode that may kill it again."""
    from types import SimpleNamespace

    from astraflow.producers.rollout.episode_journal import EpisodeJournal, EpisodeResumedTooOftenError
    from astraflow.runtime.topics import RunTopics

    killed = MemoryJournal(FIRST, kill_after=1)
    with pytest.raises(Killed):
        play(killed, version=4)
    ctx = SimpleNamespace(topics=RunTopics("run", "agent", ("main",)))
    journal = EpisodeJournal(ctx, "main", SECOND, max_resumes=2)
    held = {key: replace(record, resumes=2, producers=["a", "b", "c"]) for key, record in killed.held.items()}
    journal._recorded = {0: held}  # as ``load`` reads it from the journal's partition 0
    journal.begin(None, None, {"t1": 0, "t2": 0})
    workflow = MultiTurnWorkflow("main", lambda t, i: Counter(int(t.task_id[1:]) * 10 + i), LIMITS, 1.0)
    workflow.journal = journal
    outcomes = workflow.run_batch({"main": ScriptedEngine(TOKENIZER, lambda c: "go")}, [task(1), task(2)], SECOND)
    for outcome in outcomes:
        assert isinstance(outcome.error, EpisodeResumedTooOftenError) and outcome.trajectories == []
        assert f"episode {outcome.task.task_id}/0 was resumed 2 times already (producers a, b, c)" in str(outcome.error)


def test_the_journal_loads_its_partition_newest_record_per_episode(tmp_path) -> None:
    """``EpisodeJournal.load`` on the embedded log: the newest record of each episode, none for an episode
    whose tombstone came, and an undecodable record dead-lettered (its episode plays from its start)."""
    from astraflow.config import parse_config
    from astraflow.producers.rollout.episode_journal import EpisodeJournal
    from astraflow.runtime.attach import read_snapshot
    from astraflow.runtime.context import ComponentContext

    killed = MemoryJournal(FIRST, kill_after=2)
    with pytest.raises(Killed):
        play(killed, version=4)
    config = parse_config({"run": "r", "rollout": {"workflow": "rooms", "reward": "env"}, "log": {"partitions": 2}})
    ctx = ComponentContext(config, tmp_path, "rollout")
    try:
        topic = ctx.topics.episodes("main")
        first, second = sorted(killed.held)[:2]
        with ctx.log.producer() as producer:
            for key, record in sorted(killed.held.items()):
                producer.send(topic, ctx.codec.encode(record), key=key.encode(), partition=1)
            producer.send(topic, b"", key=first.encode(), partition=1)  # finished: its tombstone
            producer.send(topic, b"\xc3\x01garbage", key=second.encode(), partition=1)
        journal = EpisodeJournal(ctx, "main", SECOND, max_resumes=2)
        journal.load(1)
        assert set(journal._recorded[1]) == set(killed.held) - {first, second}
        assert journal._recorded[1][sorted(killed.held)[2]].response_ids.tobytes() == (
            killed.held[sorted(killed.held)[2]].response_ids.tobytes()
        )
        journal.load(0)
        assert journal._recorded[0] == {}
        ctx.producer.flush()
        letters = [ctx.codec.decode(m.value) for m in read_snapshot(ctx.log, ctx.topics.deadletter("producer"))]
        assert [letter.reason.split(":")[0] for letter in letters] == [
            "undecodable episode record (played from its start)"
        ]
        assert (letters[0].topic, letters[0].partition) == (topic, 1)
    finally:
        ctx.close()
