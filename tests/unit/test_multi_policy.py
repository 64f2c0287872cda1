"""Multi-policy runs: per-policy config, the answer/judge workflow's rewards and routing, the launch plan."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from astraflow.config import dump_config, load_config, parse_config
from astraflow.core.errors import ConfigError
from astraflow.episodes.judged import majority, pick
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.collab import NEAR_MISSES, balanced_candidates, judge_answer_reward, near_miss
from astraflow.episodes.workflows.factory import build_run_workflow
from astraflow.infra.launch.launcher import plan
from astraflow.producers.feeder.component import PolicyBudget, policy_budgets
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.arithmetic import addition_problems, judge_problems, judge_reward, judgement
from astraflow.tasks.datasets import load_policy_split

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "solver_verifier" / "config.yaml"
PROVENANCE = Provenance("rollout-test-1", "local", "cpu")
THREE = {
    "rollout": {"group_size": 4},
    "train": {"batch_samples": 64, "lr": 1e-3},
    "policies": {
        "alpha": {},
        "beta": {"train": {"lr": 5e-4}, "model": {"layers": 2}},
        "gamma": {"stream": {"max_staleness": 0}, "rollout": {"group_size": 2}},
    },
}


@dataclass
class Gen:
    text: str
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str = "stop"


class ScriptedTextEngine:
    """Answers with ``script(prompt, sample index)``: one token per character, log-prob -0.5 each."""

    def __init__(self, script, version: int) -> None:
        self.script = script
        self.version = version
        self.prompts: list[str] = []

    def generate(self, prompts, n, max_new_tokens, temperature):
        self.prompts += list(prompts)
        out = []
        for prompt in prompts:
            texts = [self.script(prompt, j) for j in range(n)]
            out.append(
                [
                    Gen(
                        t,
                        np.arange(len(prompt), dtype=np.int32),
                        np.arange(len(t) + 1, dtype=np.int32),
                        np.full(len(t) + 1, -0.5, dtype=np.float32),
                    )
                    for t in texts
                ]
            )
        return out


def task(a: int, b: int) -> RolloutTask:
    return RolloutTask(
        f"add-{a}-{b}@0",
        f"add-{a}-{b}",
        f"add-{a}-{b}@0",
        "math",
        f"{a}+{b}=",
        str(a + b),
        group_size=8,
        submitted_version=0,
        created_ms=0,
    )


@pytest.fixture
def solver_verifier():
    config = load_config(EXAMPLE, {"rollout.group_size": 3, "policies.verifier.rollout.group_size": 2})
    return config, build_run_workflow(config)


def test_three_policies_inherit_and_override_the_top_level_sections() -> None:
    config = parse_config(THREE)
    assert config.policy_names() == ("alpha", "beta", "gamma")
    alpha, beta, gamma = (config.for_policy(name) for name in config.policy_names())
    assert (alpha.policy, alpha.train.lr, alpha.model.layers, alpha.stream.max_staleness) == ("alpha", 1e-3, 4, 2)
    assert (beta.train.lr, beta.train.batch_samples, beta.model.layers) == (5e-4, 64, 2)
    assert (gamma.stream.max_staleness, gamma.rollout.group_size, gamma.rollout.max_new_tokens) == (0, 2, 4)


def test_three_policies_get_a_trainer_stream_and_evaluator_each() -> None:
    steps = plan(parse_config(THREE))
    trainers = [options for name, options in steps if options[0] == "train"]
    assert trainers == [("train", "--policy", p) for p in ("alpha", "beta", "gamma")]
    assert (
        sum(options[0] == "stream" for _, options in steps) == 3
        and sum(options[0] == "evaluate" for _, options in steps) == 3
    )
    assert [name for name, _ in steps].count("feed") == 1


def test_single_policy_config_plans_what_it_always_did() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml")
    assert [name for name, _ in plan(config)] == ["train", "evaluate", "stream", "feed"]
    assert config.for_policy("main").train == config.train


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"policies": {"a": {"train": {"lr": -1}}}}, "policies.a.train.lr"),
        ({"policies": {"a": {"model": {"heads": 3}}}}, "policies.a.model"),
        ({"policies": {"a": {"rollout": {"producers": 3}}}}, "policies.a.rollout.producers"),
        ({"policies": {"bad name": {}}}, "policies.bad name"),
        ({"mode": "lockstep", "policies": {"a": {"stream": {"max_staleness": 2}}}}, "policies.a.stream.max_staleness"),
        ({"rollout": {"workflow": "solver_verifier"}, "policies": {"a": {}, "b": {}}}, "role 'judge'"),
    ],
)
def test_bad_policy_config_names_the_field(raw: dict, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert names in str(info.value)


def test_lockstep_sets_every_staleness_to_zero() -> None:
    config = parse_config({**THREE, "mode": "lockstep"})
    assert {config.for_policy(p).stream.max_staleness for p in config.policy_names()} == {0}


def test_answers_and_judgements_are_rewarded_and_routed_by_policy(solver_verifier) -> None:
    _, workflow = solver_verifier
    workflow.judgements = 4  # claims 0, 1, 2, then 0 again
    # the solver is right on its first sample only; the verifier writes 47 unless shown 42, which it copies
    solver = ScriptedTextEngine(lambda prompt, j: "47" if j == 0 else f"4{j}", version=3)
    verifier = ScriptedTextEngine(lambda prompt, j: "42" if prompt.endswith("=42?") else "47", version=5)
    [outcome] = workflow.run_batch({"solver": solver, "verifier": verifier}, [task(12, 35)], PROVENANCE)
    assert outcome.error is None
    answers = [t for t in outcome.trajectories if t.policy == "solver"]
    judgements = [t for t in outcome.trajectories if t.policy == "verifier"]
    assert [t.reward for t in answers] == [1.0, 0.0, 0.0] and [t.response_text for t in answers] == ["47", "41", "42"]
    assert {t.group_id for t in answers} == {"add-12-35@0"} and all(t.group_size == 3 for t in answers)
    # claim 1 contrasts the right answer 0 with a near miss; answer 1 itself is not judged
    miss = near_miss("47", "add-12-35@0/1")
    assert verifier.prompts == ["12+35=47?", f"12+35={miss}?", "12+35=42?", "12+35=47?"]
    assert [t.trajectory_id for t in judgements] == [f"add-12-35@0/{j}/0" for j in range(4)]
    assert {t.group_id for t in judgements} == {"add-12-35@0"} and all(t.group_size == 4 for t in judgements)
    # accepts 47 (right), rejects the near miss by writing the sum (right), accepts 42 by copying it (wrong)
    assert [t.reward for t in judgements] == [1.0, 1.0, 0.0, 1.0]
    assert all(int(t.token_versions.max()) == 5 for t in judgements) and all(
        int(t.token_versions.max()) == 3 for t in answers
    )
    assert workflow.groups_per_task("solver") == workflow.groups_per_task("verifier") == 1


@pytest.mark.parametrize(
    ("answers", "truths"),
    [
        (["47", "47", "47", "47"], [True, False, True, False]),
        (["41", "41", "47", "9"], [False, True, True, False]),
        (["47", "41", "42"], [True, False, False]),
    ],
)
def test_claims_come_in_true_and_false_pairs(answers: list[str], truths: list[bool]) -> None:
    claims = balanced_candidates("47", answers, "add-12-35@0")
    assert [claim == "47" for claim in claims] == truths
    assert claims[0::2] == answers[0::2]
    assert all(int(claim) - 47 in NEAR_MISSES for claim in claims if claim != "47" and claim not in answers)
    assert (
        balanced_candidates("47", answers, "add-12-35@0") == claims
    )  # deterministic: a redone task judges the same claims


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("47", "47|47", 1.0),
        ("45", "47|47", 0.0),
        ("47", "47|45", 1.0),
        ("45", "47|45", 0.0),
        ("46", "47|45", 0.5),
        ("", "47|45", 0.5),
    ],
)
def test_the_judge_earns_half_for_its_verdict_and_half_for_the_sum(
    response: str, reference: str, reward: float
) -> None:
    assert judge_answer_reward(response, reference) == reward


def test_a_judge_warms_up_on_false_claims_and_is_scored_on_balanced_ones(tmp_path: Path) -> None:
    judge = load_config(EXAMPLE).for_policy("verifier")
    warmup = load_policy_split(judge, tmp_path, "train", targets=True)
    heldout = load_policy_split(judge, tmp_path, "heldout")
    assert warmup and all(row.prompt.endswith("?") and row.prompt[:-1].split("=")[1] != row.answer for row in warmup)
    assert all(int(row.answer) == sum(map(int, row.prompt.split("=")[0].split("+"))) for row in warmup)
    true = [row for row in heldout if row.answer.split("|")[0] == row.answer.split("|")[1]]
    assert 0.4 < len(true) / len(heldout) < 0.6


def test_budgets_follow_the_slowest_trainer(solver_verifier) -> None:
    config, _ = solver_verifier
    budgets = policy_budgets(config)
    # solver: 256 samples / 3 per group = 86 tasks; verifier: 256 / 2 judgements per task = 128 tasks
    assert budgets == {"solver": PolicyBudget(1, 86, 1), "verifier": PolicyBudget(1, 128, 1)}
    assert budgets["verifier"].capacity(0, dropped_groups=4) == 2 * 128 + 4
    versions, dropped = {"solver": 5, "verifier": 2}, Counter(solver=10)
    assert min(b.capacity(versions[p], dropped[p]) for p, b in budgets.items()) == 4 * 128  # the verifier is behind


def test_judge_rows_are_half_right_and_parse() -> None:
    train, _ = addition_problems(seed=0, heldout_size=100)
    rows = judge_problems(train[:2000], seed=1)
    right = [r for r in rows if r.answer.split("|")[0] == r.answer.split("|")[1]]
    assert 0.45 < len(right) / len(rows) < 0.55
    wrong = next(r for r in rows if r not in right)
    a, rest = wrong.prompt.split("+")
    b, candidate = rest.rstrip("?").split("=")
    assert int(candidate) != int(a) + int(b) and wrong.answer == f"{int(a) + int(b)}|{candidate}"


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("47", "47|47", 1.0),
        ("45", "47|47", 0.0),
        ("47", "47|45", 1.0),
        ("45", "47|45", 0.0),
        ("46", "47|45", 1.0),
        ("", "47|45", 1.0),
    ],
)
def test_the_judge_accepts_what_it_would_answer(response: str, reference: str, reward: float) -> None:
    assert judge_reward(response, reference) == reward
    assert judgement(response, reference.split("|")[1]) == (response == reference.split("|")[1])


@pytest.mark.parametrize(
    ("verdicts", "chosen"), [([False, True, True], "b"), ([False, False, False], "a"), ([True, False, False], "a")]
)
def test_the_system_keeps_the_first_accepted_answer(verdicts, chosen) -> None:
    assert pick(["a", "b", "c"], verdicts) == chosen


@pytest.mark.parametrize(
    ("candidates", "voted"),
    [(["a", "b", "b"], "b"), (["a", "b", "c"], "a"), (["c", "a", "b", "a", "b"], "a"), (["x"], "x")],
)
def test_the_majority_vote_takes_the_most_frequent_answer_and_the_earliest_of_a_tie(candidates, voted) -> None:
    assert majority(candidates) == voted


def test_the_saved_config_loads_back_with_the_same_policies(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    dump_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert all(again.for_policy(p) == config.for_policy(p) for p in config.policy_names())
    assert again.for_policy("verifier").train.lr_warmup_versions == config.train.lr_warmup_versions


def test_lockstep_tasks_carry_the_versions_producers_wait_for(tmp_path: Path) -> None:
    from astraflow.producers.feeder.component import TaskFeeder
    from astraflow.runtime.context import ComponentContext
    from astraflow.tasks.base import Problem

    ctx = ComponentContext(load_config(EXAMPLE, {"mode": "lockstep", "stream.max_staleness": 0}), tmp_path, "feed")
    try:
        feeder = TaskFeeder(ctx, [Problem("p0", "1+1=", "2")], seed=0)
        assert {b.max_staleness for b in feeder.budgets.values()} == {0}
        task = feeder.task(0, {"solver": 3, "verifier": -1})
        assert task.metadata == {"cursor": "0", "version.solver": "3", "version.verifier": "0"}
        # one batch ahead of the slowest trainer: the verifier has published nothing yet
        assert feeder.capacity({"solver": 3, "verifier": -1}, Counter()) == feeder.budgets["verifier"].tasks_per_batch
    finally:
        ctx.close()


def test_three_policies_each_play_every_task_with_their_own_group_size() -> None:
    workflow = build_run_workflow(parse_config(THREE))
    assert workflow.policies == ("alpha", "beta", "gamma")
    engines = {
        "alpha": ScriptedTextEngine(lambda p, j: "47", version=1),  # always right
        "beta": ScriptedTextEngine(lambda p, j: "47" if j == 0 else "0", version=2),
        "gamma": ScriptedTextEngine(lambda p, j: "9", version=3),
    }  # always wrong
    outcomes = workflow.run_batch(engines, [task(12, 35), task(1, 2)], PROVENANCE)
    assert [outcome.task.task_id for outcome in outcomes] == ["add-12-35@0", "add-1-2@0"]
    first = outcomes[0].trajectories
    by_policy = Counter(t.policy for t in first)
    assert by_policy == {"alpha": 4, "beta": 4, "gamma": 2}
    assert {(t.policy, t.group_size) for t in first} == {("alpha", 4), ("beta", 4), ("gamma", 2)}
    assert [t.reward for t in first if t.policy == "beta"] == [1.0, 0.0, 0.0, 0.0]
    assert {t.reward for t in first if t.policy == "gamma"} == {0.0} and {
        t.reward for t in first if t.policy == "alpha"
    } == {1.0}
    assert {int(t.token_versions.max()) for t in first if t.policy == "beta"} == {2}
    assert all(len(engine.prompts) == 2 for engine in engines.values())  # each policy saw each task once
    budgets = policy_budgets(parse_config(THREE))
    assert (
        set(budgets) == {"alpha", "beta", "gamma"} and budgets["gamma"].tasks_per_batch == 32
    )  # 64 samples / groups of 2


def test_stream_instances_are_planned_after_the_first() -> None:
    single = plan(parse_config({"stream": {"instances": 2}}))
    assert ("stream-1", ("stream", "--instance", "1")) in single
    assert sum(options[0] == "stream" for _, options in single) == 2
    steps = plan(parse_config({**THREE, "policies": {**THREE["policies"], "beta": {"stream": {"instances": 2}}}}))
    streams = [(name, options) for name, options in steps if options[0] == "stream"]
    assert streams == [
        ("stream-alpha", ("stream", "--policy", "alpha")),
        ("stream-beta", ("stream", "--policy", "beta")),
        ("stream-beta-1", ("stream", "--policy", "beta", "--instance", "1")),
        ("stream-gamma", ("stream", "--policy", "gamma")),
    ]


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"stream": {"instances": 3}, "log": {"partitions": 2}}, "exceeds log.partitions: 2"),
        (
            {"stream": {"instances": 2}, "log": {"backend": "kafka", "bootstrap": "127.0.0.1:9092"}},
            "needs stream.runtime: native",
        ),
        (
            {
                "stream": {"instances": 2, "runtime": "faust"},
                "log": {"backend": "kafka", "bootstrap": "127.0.0.1:9092"},
            },
            "needs stream.runtime: native",
        ),
    ],
)
def test_stream_instances_the_run_cannot_use_are_refused(raw: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse_config(raw)


def test_native_stream_instances_on_kafka_are_accepted() -> None:
    config = parse_config(
        {"stream": {"instances": 2, "runtime": "native"}, "log": {"backend": "kafka", "bootstrap": "127.0.0.1:9092"}}
    )
    assert config.stream.instances == 2
