"""The simulated cluster: the time models, the simulated engine and trainer, and their config.

Nothing here sleeps: engines and backends take a ``sleep`` that records the simulated seconds.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, create_tiny_checkpoint
from astraflow.config import dump_config, load_config, parse_config
from astraflow.core.errors import ConfigError
from astraflow.engines import build_engine
from astraflow.engines.simulated import DecodeTimeModel, ResponseLengths, SimulatedEngine, arithmetic_answer
from astraflow.infra.launch.launcher import plan
from astraflow.tasks.arithmetic import extract_answer
from astraflow.training.backends.simulated import SimulatedBackend, SimulatedLearner, TrainTimeModel
from astraflow.training.learner import build_backend
from astraflow.training.step import PolicyExample, PolicyStepConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "solver_verifier" / "simulated_cluster.yaml"
SMALL = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def options(**fields):
    return parse_config({"engine": {"type": "simulated", "simulated": fields}}).engine.simulated


@pytest.mark.parametrize(("median", "ratio"), [(600, 8.0), (300, 4.0), (50, 1.0)])
def test_response_lengths_have_the_configured_median_and_tail(median: int, ratio: float) -> None:
    lengths = ResponseLengths(median, ratio)
    drawn = lengths.sample(np.random.default_rng(0), 200_000, cap=10**9)
    assert np.median(drawn) == pytest.approx(median, rel=0.02)
    assert np.quantile(drawn, 0.99) / np.median(drawn) == pytest.approx(ratio, rel=0.05)
    assert lengths.quantile(0.99) == pytest.approx(median * ratio)


def test_response_lengths_are_cut_at_the_budget_and_floor() -> None:
    lengths = ResponseLengths(600, 8.0)
    drawn = lengths.sample(np.random.default_rng(1), 50_000, cap=1000, floor=3)
    assert drawn.max() == 1000 and drawn.min() >= 3
    cut = 1 - NormalDist(math.log(600), lengths.sigma).cdf(math.log(999.5))  # what a budget of 1000 tokens cuts
    assert np.mean(drawn == 1000) == pytest.approx(cut, abs=0.01)


@pytest.mark.parametrize(
    ("lengths", "slots", "step", "per_sequence", "seconds"),
    [
        ([10], 4, 1.0, 0.0, 10.0),  # one sequence: one step per token
        ([2, 2], 4, 1.0, 0.5, 4.0),  # two running sequences make each step dearer
        ([3, 1, 1, 5], 2, 1.0, 0.0, 7.0),  # the 4th waits for a free slot (step 2), then runs 5 steps
        ([100, 1, 1, 1], 4, 1.0, 0.0, 100.0),  # the straggler sets the time of the call
        ([], 4, 1.0, 0.0, 0.0),
    ],
)
def test_decode_time_is_the_makespan_of_a_continuous_batch(lengths, slots, step, per_sequence, seconds) -> None:
    assert DecodeTimeModel(step, per_sequence, slots).seconds(lengths) == pytest.approx(seconds)


def test_a_longer_tail_makes_a_batch_slower_at_the_same_median() -> None:
    rng = np.random.default_rng(2)
    model = DecodeTimeModel(0.015, 0.00008, 256)
    short, long = (model.seconds(ResponseLengths(600, ratio).sample(rng, 256, cap=4096)) for ratio in (1.5, 8.0))
    assert long > 2 * short


@pytest.mark.parametrize(
    ("prompt", "right", "first_line"),
    [("12+35=", True, "47"), ("12+35=47?", True, "47"), ("12+35=40?", True, "47"), ("hello", True, "")],
)
def test_arithmetic_answers_are_right_or_a_near_miss(prompt: str, right: bool, first_line: str) -> None:
    rng = np.random.default_rng(3)
    assert arithmetic_answer(prompt, right, rng) == first_line
    if first_line:
        wrong = {int(arithmetic_answer(prompt, False, rng)) - 47 for _ in range(200)}
        assert wrong == {-10, -2, -1, 1, 2, 10}


@pytest.mark.parametrize("accuracy", [0.0, 0.5, 1.0])
def test_simulated_engine_returns_shaped_responses_after_the_modelled_time(accuracy: float) -> None:
    slept: list[float] = []
    config = options(median_tokens=40, p99_over_p50=8.0, accuracy=accuracy, max_concurrency=16)
    engine = SimulatedEngine(build_char_tokenizer(), config, seed=0, sleep=slept.append)
    groups = engine.generate(["12+35=", "1+2=3?"], n=64, max_new_tokens=100, temperature=1.0)
    rows = [g for group in groups for g in group]
    assert all(len(g.response_ids) == len(g.logprobs) <= 100 and (g.logprobs <= 0).all() for g in rows)
    assert all(
        (g.response_ids[-1] == 1) == (g.finish_reason == "stop") for g in rows
    )  # eos id 1 ends a stopped response
    assert {g.finish_reason for g in rows} == {"stop", "length"}  # p99 = 320 tokens: some hit the budget
    right = np.mean([extract_answer(g.text) == ("47" if i < 64 else "3") for i, g in enumerate(rows)])
    assert right == pytest.approx(accuracy, abs=0.12)
    decode = DecodeTimeModel(config.decode_step_seconds, config.seq_step_seconds, config.max_concurrency)
    assert slept == [pytest.approx(decode.seconds([len(g.response_ids) for g in rows]))]
    assert engine.simulated_seconds == pytest.approx(slept[0])


def test_simulated_engine_takes_load_seconds_to_apply_a_version() -> None:
    slept: list[float] = []
    engine = SimulatedEngine(build_char_tokenizer(), options(load_seconds=3.0), sleep=slept.append)
    engine.load_state_dict({}, 7)
    assert (engine.version, slept) == (7, [3.0])


@pytest.mark.parametrize(
    ("samples", "tokens", "devices", "seconds"),
    [
        (256, 1000, 2, 1.0 + 256 * (0.01 + 1000 * 0.0002) / 2),
        (512, 1000, 2, 1.0 + 512 * (0.01 + 0.2) / 2),
        (256, 1000, 8, 1.0 + 256 * 0.21 / 8),
    ],
)
def test_train_step_time_scales_with_samples_tokens_and_devices(
    samples: int, tokens: int, devices: int, seconds: float
) -> None:
    model = TrainTimeModel(step_seconds=1.0, sample_seconds=0.01, token_seconds=0.0002, devices=devices)
    assert model.seconds([tokens] * samples) == pytest.approx(seconds)


def test_simulated_learner_sleeps_its_step_and_leaves_the_weights() -> None:
    model = build_tiny_model(build_char_tokenizer(), SMALL)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    slept: list[float] = []
    backend = SimulatedBackend(model, TrainTimeModel(0.5, 0.0, 0.001, 2), sleep=slept.append)
    learner = SimulatedLearner(model, 0, PolicyStepConfig(), backend)
    example = PolicyExample(
        np.arange(6, dtype=np.int32),
        np.arange(94, dtype=np.int32),
        np.zeros(94, np.float32),
        np.ones(94, np.uint8),
        1.0,
    )
    stats = learner.step([example] * 10)
    assert isinstance(learner, SimulatedLearner) and (learner.version, stats.version, stats.sequences) == (1, 1, 10)
    assert slept == [pytest.approx(0.5 + 10 * 100 * 0.001 / 2)] and stats.loss_stats["simulated_seconds"] == slept[0]
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert learner.optimizer.state_dict()["state"] == {}


def test_simulated_engine_and_backend_are_chosen_by_config(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    checkpoint = create_tiny_checkpoint(tmp_path / "policy", SMALL)
    verifier = config.for_policy("verifier")
    engine = build_engine(verifier.engine, checkpoint)
    assert (
        isinstance(engine, SimulatedEngine) and engine.options.median_tokens == 300 and engine.options.time_scale == 0.1
    )
    backend = build_backend(
        verifier.train.backend,
        build_tiny_model(build_char_tokenizer(), SMALL),
        lr=1e-3,
        betas=(0.9, 0.99),
        weight_decay=0.0,
        max_grad_norm=1.0,
        simulated=verifier.train.simulated,
    )
    assert isinstance(backend, SimulatedBackend) and backend.time_model.devices == 2


def test_per_policy_engine_overrides_merge_field_by_field_and_survive_saving(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    solver, verifier = config.for_policy("solver").engine.simulated, config.for_policy("verifier").engine.simulated
    assert (solver.median_tokens, verifier.median_tokens, verifier.accuracy) == (600, 300, 0.7)
    assert (
        verifier.decode_step_seconds == solver.decode_step_seconds and verifier.time_scale == solver.time_scale == 0.1
    )
    dump_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config


def test_a_simulated_run_starts_no_evaluator() -> None:
    assert [name for name, options in plan(load_config(EXAMPLE)) if options[0] == "evaluate"] == []


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"engine": {"type": "simulated", "simulated": {"p99_over_p50": 0.5}}}, "engine.simulated.p99_over_p50"),
        ({"engine": {"simulated": {"max_concurrency": 0}}}, "engine.simulated.max_concurrency"),
        ({"engine": {"simulated": {"accuracy": 1.5}}}, "engine.simulated.accuracy"),
        ({"train": {"simulated": {"devices": 0}}}, "train.simulated.devices"),
        ({"train": {"simulated": {"time_scale": 0}}}, "train.simulated.time_scale"),
        (
            {"engine": {"type": "simulated", "simulated": {"time_scale": 0.1}}, "train": {"backend": "simulated"}},
            "must be equal",
        ),
        (
            {"policies": {"a": {"engine": {"simulated": {"median_tokens": 0}}}}},
            "policies.a.engine.simulated.median_tokens",
        ),
    ],
)
def test_bad_simulation_config_names_the_field(raw: dict, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert names in str(info.value)


def test_the_simulated_clusters_base_holds_the_responses_it_stands_for(tmp_path, monkeypatch) -> None:
    """The simulated engine writes responses of up to ``rollout.max_new_tokens`` (4096) for a model it only
    times; the base records a context that holds them, so the stream's validation does not dead-letter every
    long one as past the tiny model's 64 positions (which stalled the example at version 0)."""
    from astraflow.basemodel.cache import ensure_base_checkpoint
    from astraflow.runtime.base_checkpoint import model_limits

    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    config = load_config(EXAMPLE, {"warmup": {"max_steps": 1, "eval_every": 1}}).for_policy("solver")
    torch_engine = config.model_copy(update={"engine": config.engine.model_copy(update={"type": "torch"})})
    _, context = model_limits(ensure_base_checkpoint(torch_engine, tmp_path / "torch"))  # cached first: not shared
    assert context == 64
    _, context = model_limits(ensure_base_checkpoint(config, tmp_path / "run"))
    assert context >= 64 + config.rollout.max_new_tokens
