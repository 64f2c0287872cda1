"""The code environment: each policy turn is a whole Python program, run on the task's tests.

Every test runs the program (stdin = the test's input; all of a program's tests in one sandbox,
each in its own process with its own limits) and passes when stdout, stripped, equals the
expected output, which never enters the sandbox. All passing ends the episode; otherwise the
observation reports the first failure (``\\nf(3) should be 10, got 9\\n``) and the policy may try
again, within the workflow's turn limit. Reward = the fraction of tests the *last* program passed.

A program that crashes, hangs or exceeds a limit fails that test. A sandbox that cannot run it
raises ``SandboxError`` out of ``step``: the task fails, it is never scored 0.

The turns of several episodes are judged together (``step_many``): their programs run one after
another in one sandbox (``Sandbox.run_python_programs``; each still finds the sandbox as the first
did), and a program that several episodes wrote for the same tests runs once, since a group's
samples often agree (a program whose output is random gets that one run's outcome for every
copy). Starting a sandbox (~60 ms here) cost 6x the five tests of a program.
"""

from __future__ import annotations

from collections.abc import Sequence

from astraflow.envs.base import EnvError, EpisodeEnv, StepResult
from astraflow.sandbox import RunResult, Sandbox
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.code.programs import parse_reference


class CodeEnv(EpisodeEnv):
    role = "tool"
    batch_steps = True

    def __init__(self, task: RolloutTask, sandbox: Sandbox) -> None:
        try:
            self.tests, _ = parse_reference(task.reference)
        except (ValueError, KeyError, TypeError) as exc:
            raise EnvError(f"code: task {task.task_id} has no tests in its reference: {exc}") from exc
        if not self.tests:
            raise EnvError(f"code: task {task.task_id} has an empty test list")
        self.task = task
        self.sandbox = sandbox
        self.passed = 0
        self.attempts = 0
        self.failures = 0  # crashes, timeouts and limit kills over all attempts

    def reset(self) -> str:
        return self.task.prompt

    def step(self, action: str) -> StepResult:
        return self._judge(self.sandbox.run_python_tests(action, self.inputs()))

    @classmethod
    def step_many(cls, envs: Sequence[CodeEnv], actions: Sequence[str]) -> list[StepResult]:
        programs: dict[Sandbox, dict[tuple[str, tuple[str, ...]], list[RunResult]]] = {}
        for env, action in zip(envs, actions, strict=True):
            programs.setdefault(env.sandbox, {})[action, env.inputs()] = []
        for sandbox, runs in programs.items():
            keys = list(runs)
            runs.update(zip(keys, sandbox.run_python_programs(keys), strict=True))
        return [env._judge(programs[env.sandbox][action, env.inputs()]) for env, action in zip(envs, actions)]

    def inputs(self) -> tuple[str, ...]:
        return tuple(test.input for test in self.tests)

    def _judge(self, results: Sequence[RunResult]) -> StepResult:
        self.attempts += 1
        self.passed, first_failure = 0, None
        for test, result in zip(self.tests, results):
            if result.ok and result.stdout.strip() == test.output.strip():
                self.passed += 1
                continue
            self.failures += not result.ok
            if first_failure is None:
                got = result.stdout.strip()[:20] if result.ok else result.describe()
                first_failure = f"\nf({test.input.strip()}) should be {test.output.strip()}, got {got}\n"
        return StepResult("", done=True) if first_failure is None else StepResult(first_failure)

    def reward(self) -> dict[str, float]:
        fraction = self.passed / len(self.tests)
        return {
            "reward": fraction,
            "tests_passed": fraction,
            "attempts": float(self.attempts),
            "program_failures": float(self.failures),
        }
