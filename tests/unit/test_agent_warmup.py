"""Warm-up and evaluation of multi-turn tasks: demonstrations are played exactly as rollouts are,
greedy held-out success comes from the same loop, and environments open only when used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.cache import _cache_key
from astraflow.basemodel.sft import demonstration_examples
from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import AgentConfig, RunConfig, load_config, parse_config
from astraflow.core.errors import ConfigError
from astraflow.envs.base import EnvError
from astraflow.episodes.heldout import evaluate_episodes, evaluation_task
from astraflow.episodes.loop import AgentLimits, demonstrate
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.multiturn import MultiTurnWorkflow
from astraflow.tasks.catalog import open_environments
from astraflow.tasks.datasets import task_alphabet, task_demonstration
from astraflow.tasks.rooms.data import room_problems
from astraflow.tasks.search.facts import SEARCH_SHARE, fact_problems
from tests.unit.scripted_engine import ScriptedEngine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TOKENIZER = build_char_tokenizer(task_alphabet("search_facts"))
LIMITS = AgentLimits(max_turns=8, max_new_tokens=32, max_total_tokens=512, max_observation_tokens=64)


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    data = tmp_path_factory.mktemp("facts")
    train, _ = fact_problems(seed=0, heldout_size=20, data_dir=data, entities=60)
    return train, data


def replay(
    workflow: str, problem, data_dir: Path | None, agent: AgentConfig = AgentConfig(max_turns=8, max_total_tokens=512)
):
    """The demonstration of ``problem`` played by a policy that writes exactly its turns, as a rollout."""
    make_env = open_environments(workflow, {"search": "exact_match", "rooms": "env"}[workflow], agent, data_dir)
    turns = iter(task_demonstration({"search": "search_facts", "rooms": "rooms"}[workflow])(problem))
    workflow_run = MultiTurnWorkflow("main", make_env, LIMITS, temperature=1.0)
    [outcome] = workflow_run.run_batch(
        {"main": ScriptedEngine(TOKENIZER, lambda context: next(turns))},
        [evaluation_task(problem, workflow)],
        Provenance("p", "r", "h"),
    )
    return make_env, outcome.trajectories[0]


@pytest.mark.parametrize("workflow", ["search", "rooms"])
def test_a_demonstration_is_token_for_token_the_rollout_of_its_turns(workflow: str, facts) -> None:
    train, data = facts
    problem = (
        next(p for p in train if len(task_demonstration("search_facts")(p)) == 2)
        if workflow == "search"
        else room_problems(0, 5, games=20)[0][3]
    )
    make_env, trajectory = replay(workflow, problem, data)
    transcript = demonstrate(
        make_env(evaluation_task(problem, workflow), 0),
        task_demonstration({"search": "search_facts", "rooms": "rooms"}[workflow])(problem),
        TOKENIZER,
        LIMITS,
    )
    response, _, _, mask = transcript.arrays()
    assert trajectory.reward == 1.0 and len(transcript.turns) >= 3
    assert np.array_equal(transcript.prompt_ids, trajectory.prompt_ids) and np.array_equal(
        response, trajectory.response_ids
    )
    assert np.array_equal(mask, trajectory.loss_mask) and [t.role for t in transcript.turns] == [
        t.role for t in trajectory.turns
    ]
    [example] = demonstration_examples([transcript])
    assert 0 < example.loss_mask.sum() < len(example.response_ids)  # the tool / environment turns are not supervised


def test_search_demonstrations_search_for_a_share_and_guess_otherwise(facts) -> None:
    train, _ = facts
    turns = [task_demonstration("search_facts")(p) for p in train]
    searched = [t for t in turns if t[0].startswith("search(")]
    assert abs(len(searched) / len(turns) - SEARCH_SHARE) < 0.1
    assert all(len(t) == 1 and t[0].startswith("answer(") for t in turns if t not in searched)
    assert turns == [task_demonstration("search_facts")(p) for p in train]  # deterministic


def test_greedy_episode_evaluation(facts) -> None:
    train, data = facts
    model = build_tiny_model(
        TOKENIZER, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256)
    )
    make_env = open_environments("search", "exact_match", AgentConfig(), data)
    limits = AgentLimits(max_turns=2, max_new_tokens=6, max_total_tokens=48)
    model.train()
    score = evaluate_episodes(model, TOKENIZER, train[:12], make_env, limits, workflow="search")
    assert score == 0.0 and model.training  # a random model never answers right; the mode is restored
    with torch.no_grad():
        first = evaluate_episodes(model, TOKENIZER, train[:12], make_env, limits, batch_size=5)
    assert first == score

    def broken(task, episode):
        raise EnvError("the environment broke")

    with pytest.raises(EnvError, match="broke"):
        evaluate_episodes(model, TOKENIZER, train[:3], broken, limits)


def test_environments_open_on_first_use_only(tmp_path: Path) -> None:
    lazy = open_environments(
        "search", "exact_match", AgentConfig(), None
    )  # what the task feeder builds: nothing opened
    with pytest.raises(ConfigError, match="agent.corpus_file"):
        lazy.open()
    with pytest.raises(ConfigError, match="rollout.reward"):
        open_environments("rooms", "exact_match", AgentConfig(), None)
    with pytest.raises(ConfigError, match="agent.env_url"):
        open_environments("http_env", "env", AgentConfig(), None)
    rooms = open_environments("rooms", "env", AgentConfig(), None)
    env = rooms(evaluation_task(room_problems(0, 5, games=20)[0][0], "rooms"), 0)
    assert env.reset().startswith("find the key.")


def test_multi_turn_base_checkpoints_have_their_own_alphabet_and_cache_key() -> None:
    math = RunConfig()
    search = parse_config(
        {"task": {"kind": "search_facts"}, "rollout": {"workflow": "search", "reward": "exact_match"}}
    )
    longer = parse_config(
        {
            "task": {"kind": "search_facts"},
            "rollout": {"workflow": "search", "reward": "exact_match"},
            "agent": {"max_turns": 5},
        }
    )
    assert len({_cache_key(math), _cache_key(search), _cache_key(longer)}) == 3
    assert set("search(zorvex city)answer(paris)\n") <= set(task_alphabet("search_facts"))
    assert set(json.loads(room_problems(0, 5, games=20)[0][0].answer)) == {"seed", "size"}


def test_a_changed_task_generator_gets_a_new_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import astraflow.tasks.code.programs as programs

    code = parse_config({"task": {"kind": "code_io"}, "rollout": {"workflow": "code", "reward": "tests_passed"}})
    before, math = _cache_key(code), _cache_key(RunConfig())
    monkeypatch.setattr(programs, "DATA_VERSION", programs.DATA_VERSION + 1)
    assert _cache_key(code) != before
    assert _cache_key(RunConfig()) == math  # a task whose generator never changed keeps its key


def test_warm_up_micro_batches_get_their_own_cache_key_and_leave_other_keys_as_they_were() -> None:
    math = RunConfig()
    cut = parse_config({"warmup": {"micro_batch_tokens": 2048}})
    assert _cache_key(cut) != _cache_key(math)
    # a base cached before ``max_overshoot`` may have stopped far past its target (0.535 for 0.30): the
    # math example's key from then ("1204139d8227abe0") must not find it
    assert _cache_key(load_config(EXAMPLES / "math" / "config.yaml")) != "1204139d8227abe0"


def overshoot_fit(scores: list[float], max_overshoot: float | None, steps: int = 40):
    """``fit`` of a tiny model, every 5 steps, scored by the scripted ``scores`` in the order asked for."""
    from astraflow.basemodel.sft import fit
    from astraflow.training.step import PolicyExample

    rng = np.random.default_rng(0)
    examples = [
        PolicyExample(
            rng.integers(3, 10, 3).astype(np.int32),
            rng.integers(3, 10, 4).astype(np.int32),
            np.zeros(4, np.float32),
            np.ones(4, np.uint8),
            0.0,
        )
        for _ in range(12)
    ]
    tokenizer = build_char_tokenizer("abcdefghij")
    model = build_tiny_model(tokenizer, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    script = iter(scores)
    result = fit(
        model,
        tokenizer.pad_token_id,
        examples,
        lambda: next(script),
        target=0.30,
        max_steps=steps,
        batch_size=4,
        lr=1e-2,
        eval_every=5,
        max_overshoot=max_overshoot,
    )
    return model, result


def test_a_warm_up_that_jumps_past_its_target_replays_the_last_steps_one_by_one() -> None:
    # evaluations at steps 0, 5, 10, 15: 0.6 overshoots, so steps 11, 12, ... are replayed and scored one by one
    model, result = overshoot_fit([0.0, 0.1, 0.2, 0.6, 0.25, 0.31, 0.9], max_overshoot=0.05)
    assert (result.steps, result.heldout_em) == (12, 0.31)
    assert [(step, score) for step, _, score in result.curve] == [
        (0, 0.0),
        (5, 0.1),
        (10, 0.2),
        (15, 0.6),
        (11, 0.25),
        (12, 0.31),
    ]
    # the replay is the same training: the model is the one 12 uninterrupted steps make
    straight, _ = overshoot_fit([0.0] * 4, max_overshoot=None, steps=12)  # scored at 0, 5, 10, 12
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("scores", "max_overshoot", "stop"),
    [
        ([0.0, 0.1, 0.34], 0.05, (10, 0.34)),  # within the margin: the evaluation ends the warm-up
        ([0.0, 0.1, 0.6], None, (10, 0.6)),  # no margin: the first evaluation at or above the target
        ([0.0, 0.6, 0.1, 0.2, 0.3], 0.05, (3, 0.3)),  # replayed from step 0, stops at the target exactly
    ],
)
def test_a_warm_up_stops_at_the_first_score_in_reach_of_its_target(
    scores: list[float], max_overshoot: float | None, stop: tuple[int, float]
) -> None:
    _, result = overshoot_fit(scores, max_overshoot)
    assert (result.steps, result.heldout_em) == stop


def test_the_warm_up_cuts_a_batch_by_length_and_keeps_its_gradient() -> None:
    from astraflow.basemodel.sft import fit, micro_batches
    from astraflow.training.step import PolicyExample, collate, response_logprobs

    rng = np.random.default_rng(0)
    lengths = [4, 40, 9, 30, 5, 22, 60, 12]
    examples = [
        PolicyExample(
            rng.integers(3, 10, 3).astype(np.int32),
            rng.integers(3, 10, n).astype(np.int32),
            np.zeros(n, np.float32),
            (rng.random(n) < 0.7).astype(np.uint8),
            0.0,
        )
        for n in lengths
    ]
    parts = micro_batches(examples, 100)
    assert sorted(id(e) for part in parts for e in part) == sorted(id(e) for e in examples)
    assert [len(e.response_ids) for part in parts for e in part] == sorted(lengths)  # ordered by length
    assert all(len(p) * max(len(e.prompt_ids) + len(e.response_ids) for e in p) <= 100 for p in parts if len(p) > 1)
    assert len(parts) > 1 and micro_batches(examples, 10_000) == [sorted(examples, key=lambda e: len(e.response_ids))]

    tokenizer = build_char_tokenizer("abcdefghij")
    spec = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    whole, cut = build_tiny_model(tokenizer, spec), build_tiny_model(tokenizer, spec)
    cut.load_state_dict(whole.state_dict())
    # one step of fit (micro-batches of at most 100 padded tokens) against the same step on one padded batch
    fit(
        cut,
        tokenizer.pad_token_id,
        examples,
        lambda: 0.0,
        target=1.0,
        max_steps=1,
        batch_size=8,
        lr=1e-2,
        micro_batch_tokens=100,
    )
    optimizer = torch.optim.AdamW(whole.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
    whole.train()
    batch = collate(examples, tokenizer.pad_token_id, whole.device)
    (-(response_logprobs(whole, batch) * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(whole.parameters(), 1.0)
    optimizer.step()
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(cut.state_dict()[name], value, rtol=1e-4, atol=1e-6)
