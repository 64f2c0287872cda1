"""Bundled environments: the rooms game, the HTTP adapter against a stdlib server, the code env."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from astraflow.envs.base import EnvError
from astraflow.envs.http import HttpEnv
from astraflow.envs.server import EnvServer
from astraflow.sandbox import BACKENDS, SandboxError, SandboxLimits, probe
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.code.env import CodeEnv
from astraflow.tasks.code.programs import parse_reference, program_problems
from astraflow.tasks.rooms.data import room_problems
from astraflow.tasks.rooms.env import DIRECTIONS, OPPOSITE, RoomsEnv, RoomsLayout, layout_from_reference, neighbour
from astraflow.tasks.rooms.server import rooms_factory


def rooms_task(seed: int, size: int = 3) -> RolloutTask:
    return RolloutTask(
        f"r{seed}@0", f"r{seed}", f"r{seed}@0", "rooms", "", json.dumps({"seed": seed, "size": size}), 1, 0, 0
    )


@pytest.mark.parametrize("seed", range(8))
def test_rooms_layout_is_a_connected_deterministic_maze(seed: int) -> None:
    layout = RoomsLayout.generate(seed, 3)
    assert layout == RoomsLayout.generate(seed, 3) and len(layout.doors) == 8  # a spanning tree of 9 rooms
    env = RoomsEnv(layout)
    assert env.reset().startswith("find the key. you are in the ")
    for direction in layout.shortest_path()[:-1]:  # the shortest path only ever gets warmer
        step = env.step(f"go({direction})")
        assert not step.done and step.observation.endswith(" warmer.\n")
    assert env.step(f"go({layout.shortest_path()[-1]})").done
    assert env.reward() == {"reward": 1.0, "found": 1.0, "moves": float(len(layout.shortest_path())), "invalid": 0.0}


@pytest.mark.parametrize("seed", range(8))
def test_rooms_says_warmer_or_colder_after_every_move(seed: int) -> None:
    layout = RoomsLayout.generate(seed, 3)
    distance = layout.distances()
    assert distance[layout.start] == len(layout.shortest_path()) and distance[layout.key] == 0
    signals = []
    for cell in layout.names:
        for direction in layout.exits(cell):
            env = RoomsEnv(layout)
            env.cell = cell
            step = env.step(f"go({direction})")
            there = neighbour(cell, direction)
            if there == layout.key:
                assert step.done and "found the key" in step.observation
                continue
            signal = "warmer" if distance[there] < distance[cell] else "colder"
            back = OPPOSITE[direction]
            assert step.observation == f"\n{layout.describe(there, back)} {signal}.\n"
            assert f"{back} (back)" in step.observation and step.observation.count("(back)") == 1
            signals.append(signal)
    assert {"warmer", "colder"} <= set(signals)


def test_rooms_invalid_moves_are_observations() -> None:
    layout = RoomsLayout.generate(0, 2)
    env = RoomsEnv(layout)
    env.reset()
    blocked = next(d for d in DIRECTIONS if d not in layout.exits(layout.start))
    assert env.step(f"go({blocked})").observation.startswith(f"\nno door {blocked}.")
    assert "write go(north)" in env.step("fly(up)").observation
    assert env.reward() == {"reward": 0.0, "found": 0.0, "moves": 0.0, "invalid": 2.0}


def test_rooms_problems_and_bad_references() -> None:
    train, heldout = room_problems(seed=0, heldout_size=5, games=20)
    assert len(train) == 15 and train[0].prompt == RoomsEnv(layout_from_reference(train[0].answer)).reset()
    with pytest.raises(EnvError, match="bad task reference"):
        layout_from_reference("{}")


@pytest.fixture
def server() -> Iterator[EnvServer]:
    server = EnvServer(rooms_factory).start()
    yield server
    server.stop()


def test_http_adapter_plays_the_served_game_like_the_local_one(server: EnvServer) -> None:
    task = rooms_task(5)
    remote, local = HttpEnv(server.url, task, 0), RoomsEnv(layout_from_reference(task.reference))
    assert remote.reset() == local.reset()
    for action in ["go(nowhere)", *(f"go({d})" for d in local.layout.shortest_path())]:
        assert remote.step(action) == local.step(action)
    assert remote.reward() == local.reward() and remote.reward()["reward"] == 1.0
    remote.close()
    assert server.sessions == {}


def test_http_failures_are_environment_errors(server: EnvServer) -> None:
    with pytest.raises(EnvError, match="answered 400"):
        HttpEnv(server.url, rooms_task(1), 0).step("go(north)")  # no session: never reset
    with pytest.raises(EnvError, match="answered 500"):
        HttpEnv(server.url, RolloutTask("t", "t", "t", "rooms", "", "not json", 1, 0, 0), 0).reset()
    url = server.url
    server.stop()
    with pytest.raises(EnvError, match="failed"):
        HttpEnv(url, rooms_task(1), 0, timeout_s=1.0).reset()


@pytest.fixture(scope="module")
def sandbox():
    for cls in BACKENDS.values():
        box = cls(SandboxLimits(wall_seconds=2.0))
        if probe(box) is None:
            return box
    if os.environ.get("CI", "").lower() == "true":  # make test installs bubblewrap: a CI machine has one
        pytest.fail("no sandbox backend works here")
    pytest.skip("no sandbox backend works here")


def code_task(problem_index: int = 0) -> tuple[RolloutTask, str]:
    problem = program_problems(seed=0, heldout_size=16)[0][problem_index]
    return RolloutTask(
        "c@0", problem.prompt_id, "c@0", "code", problem.prompt, problem.answer, 1, 0, 0
    ), parse_reference(problem.answer)[1]


def test_code_env_scores_tests_passed(sandbox) -> None:
    task, solution = code_task()
    env = CodeEnv(task, sandbox)
    assert env.reset() == task.prompt and task.prompt.count("f(") == 3
    first = env.step("print(0)")
    assert not first.done and "should be" in first.observation and env.reward()["reward"] < 1.0
    crash = env.step("raise SystemExit(3)")
    assert "exit 3" in crash.observation and env.reward()["reward"] == 0.0
    assert env.step(solution).done
    assert env.reward() == {"reward": 1.0, "tests_passed": 1.0, "attempts": 3.0, "program_failures": 5.0}


def test_code_env_judges_several_turns_in_one_sandbox_as_one_at_a_time(sandbox, monkeypatch) -> None:
    """``step_many`` gives each episode what ``step`` gives it, runs every distinct program once, all
    in one sandbox (a group's samples often write the same program)."""
    tasks = [code_task(i) for i in range(3)]
    actions = [
        (0, tasks[0][1]),
        (0, "print(0)"),
        (1, tasks[1][1]),
        (0, tasks[0][1]),  # the same program for the same tests: run once
        (2, "raise SystemExit(3)"),
        (1, tasks[0][1]),  # the same program for other tests: run again
    ]
    alone = []
    for i, action in actions:
        env = CodeEnv(tasks[i][0], sandbox)
        alone.append((env.step(action), env.reward()))
    runs = []
    original = type(sandbox).run_python_programs
    monkeypatch.setattr(
        type(sandbox),
        "run_python_programs",
        lambda self, programs: runs.append(len(programs)) or original(self, programs),
    )
    envs = [CodeEnv(tasks[i][0], sandbox) for i, _ in actions]
    together = CodeEnv.step_many(envs, [action for _, action in actions])
    assert [(step, env.reward()) for step, env in zip(together, envs)] == alone
    assert runs == [5]


def test_code_env_sandbox_failure_is_an_error_not_a_zero(sandbox) -> None:
    task, solution = code_task()
    broken = type(sandbox)(sandbox.limits, python="/nonexistent/python3")
    with pytest.raises(SandboxError):
        CodeEnv(task, broken).step(solution)
    with pytest.raises(EnvError, match="no tests"):
        CodeEnv(RolloutTask("c", "c", "c", "code", "p", "not json", 1, 0, 0), sandbox)


def test_every_generated_solution_passes_its_tests(sandbox) -> None:
    train, heldout = program_problems(seed=0, heldout_size=16)
    assert len({p.prompt_id for p in train + heldout}) == len(train) + len(heldout)
    for problem in heldout[:4]:
        tests, solution = parse_reference(problem.answer)
        assert len(tests) == 5
        assert [r.stdout for r in sandbox.run_python_tests(solution, [test.input for test in tests])] == [
            test.output for test in tests
        ]


def test_a_program_with_the_right_offset_earns_partial_credit(sandbox) -> None:
    """The prompt shows f(0) and f(1): copying f(0) as the offset passes the f(0) test even with a
    wrong slope, so rewards within a group vary before the policy can subtract."""
    train, _ = program_problems(seed=0, heldout_size=16)
    problem = next(p for p in train if p.prompt_id.startswith("prog-lin-"))
    _, a, b = problem.prompt_id.rsplit("-", 2)
    assert problem.prompt.startswith(f"f(0)={b} f(1)={int(a) + int(b)} ")
    task = RolloutTask("c@0", problem.prompt_id, "c@0", "code", problem.prompt, problem.answer, 1, 0, 0)
    env = CodeEnv(task, sandbox)
    env.step(f"n=int(input())\nprint(n*{int(a) + 1}+{b})\n")
    assert env.reward()["reward"] == 0.2
