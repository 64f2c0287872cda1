"""The tiny model, the engine and the trainer step agree with each other on a real (tiny) model."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.sft import supervised_warmup
from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import load_config, write_config_over
from astraflow.core.errors import ConfigError
from astraflow.engines.loading import load_policy, save_policy
from astraflow.engines.torch_engine import TorchEngine
from astraflow.episodes.heldout import evaluate_exact_match
from astraflow.tasks.arithmetic import addition_problems
from astraflow.training.learner import step_config
from astraflow.training.step import (
    PolicyExample,
    PolicyStepConfig,
    PolicyTrainer,
    collate,
    lr_factor,
    response_logprobs,
)

MATH_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
SMALL = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)


@pytest.fixture(scope="module", autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("text", ["12+35=", "99+99=198", "a b\nc", ""])
def test_tokenizer_round_trip(text: str) -> None:
    tokenizer = build_char_tokenizer("0123456789+= abc\n")
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*ids, tokenizer.eos_token_id], skip_special_tokens=True) == text
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)


def test_save_load_round_trip(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL).eval()
    save_policy(model, tokenizer, tmp_path / "policy")
    loaded, loaded_tokenizer = load_policy(tmp_path / "policy")
    ids = torch.tensor([tokenizer("12+35=")["input_ids"]])
    assert loaded_tokenizer("12+35= \n")["input_ids"] == tokenizer("12+35= \n")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    with pytest.raises(ConfigError):
        load_policy(tmp_path / "missing")


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_engine_logprobs_equal_a_fresh_forward_pass(temperature: float) -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    engine = TorchEngine(model, tokenizer, seed=0)
    groups = engine.generate(["12+35=", "1+1=", "99+99=", "7"], n=3, max_new_tokens=6, temperature=temperature)
    assert [len(group) for group in groups] == [3, 3, 3, 3]
    generations = [generation for group in groups for generation in group]
    assert {generation.finish_reason for generation in generations} <= {"stop", "length"}
    examples = [
        PolicyExample(g.prompt_ids, g.response_ids, g.logprobs, np.ones(len(g.response_ids), np.uint8), 0.0)
        for g in generations
    ]
    batch = collate(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        fresh = response_logprobs(model, batch, temperature)
    torch.testing.assert_close(fresh * batch.loss_mask, batch.behaviour_logprobs, atol=1e-4, rtol=0)


def test_engine_stops_at_eos_and_swaps_weights() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    engine = TorchEngine(model, tokenizer, seed=0)
    eos_bias = torch.zeros(len(tokenizer))
    eos_bias[tokenizer.eos_token_id] = 100.0
    hook = model.lm_head.register_forward_hook(lambda _module, _inputs, logits: logits + eos_bias)
    (generation,) = engine.generate(["12+35="], n=1, max_new_tokens=5, temperature=1.0)[0]
    hook.remove()
    assert generation.finish_reason == "stop"
    assert generation.response_ids.tolist() == [tokenizer.eos_token_id] and generation.text == ""
    assert generation.logprobs.tolist() == pytest.approx([0.0], abs=1e-6)
    fresh = build_tiny_model(tokenizer, SMALL)
    engine.load_state_dict({name: t.to(torch.bfloat16) for name, t in fresh.state_dict().items()}, version=7)
    assert engine.version == 7
    for name, tensor in model.state_dict().items():  # every tensor, in the model's own dtype
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, fresh.state_dict()[name].to(torch.bfloat16).float()), name
    with pytest.raises(RuntimeError, match="Missing key"):  # not the model's names: torch's checks and message
        engine.load_state_dict({name: t for name, t in fresh.state_dict().items() if "lm_head" not in name}, 8)
    wrong = dict(fresh.state_dict(), **{"lm_head.weight": torch.zeros(3, 3)})
    with pytest.raises(RuntimeError, match="size mismatch"):
        engine.load_state_dict(wrong, 9)


def test_micro_batches_give_the_full_batch_gradient() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    engine = TorchEngine(model, tokenizer, seed=0)
    groups = engine.generate(["12+35=", "40+2="], n=3, max_new_tokens=4, temperature=1.0)
    examples = [
        PolicyExample(g.prompt_ids, g.response_ids, g.logprobs, np.ones(len(g.response_ids), np.uint8), adv)
        for group in groups
        for g, adv in zip(group, [1.0, -0.5, -0.5], strict=True)
    ]
    whole = PolicyTrainer(copy.deepcopy(model), tokenizer.pad_token_id, PolicyStepConfig(lr=0.0))
    split = PolicyTrainer(copy.deepcopy(model), tokenizer.pad_token_id, PolicyStepConfig(lr=0.0, micro_batch_size=4))
    stats = whole.step(examples)
    split_stats = split.step(examples)
    assert stats.version == split_stats.version == 1
    assert stats.loss == pytest.approx(split_stats.loss, abs=1e-6)
    assert stats.loss_stats["ratio_mean"] == pytest.approx(1.0)
    for a, b in zip(whole.model.parameters(), split.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_dr_grpo_from_yaml_divides_by_a_constant_not_the_padded_width(tmp_path: Path) -> None:
    """``train.loss.aggregation: seq-mean-token-sum-norm`` in YAML: the loss is the token losses'
    sum over sequences × ``rollout.max_new_tokens`` (4), whether the batch is padded to width 2 (in
    one pass) or its micro-batches to widths 1 and 2, so splitting changes neither loss nor gradient."""
    config = load_config(
        write_config_over(
            MATH_EXAMPLE,
            tmp_path / "config.yaml",
            train={"loss": {"aggregation": "seq-mean-token-sum-norm", "micro_batch_size": 2}},
        )
    )
    assert config.rollout.max_new_tokens == 4
    split_config = step_config(config.train, config.rollout)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    prompt = np.asarray(tokenizer("12+35=")["input_ids"], np.int32)
    rng = np.random.default_rng(3)
    examples = [  # the first micro-batch holds responses of 1 token, the second of 2
        PolicyExample(
            prompt,
            rng.integers(3, 13, size=length).astype(np.int32),
            rng.uniform(-3.0, -1.0, size=length).astype(np.float32),
            np.ones(length, np.uint8),
            advantage,
        )
        for length, advantage in [(1, 1.0), (1, -0.5), (2, 0.5), (2, -1.0)]
    ]
    split = PolicyTrainer(copy.deepcopy(model), tokenizer.pad_token_id, split_config)
    whole = PolicyTrainer(
        copy.deepcopy(model), tokenizer.pad_token_id, dataclasses.replace(split_config, micro_batch_size=None)
    )
    with torch.no_grad():
        batch = collate(examples, tokenizer.pad_token_id)  # [4, 2]: padded to the longest response
        weight = torch.exp(response_logprobs(model, batch) - batch.behaviour_logprobs).clamp(max=2.0)
        token_losses = -weight * batch.advantages[:, None] * batch.loss_mask  # ρ = 1 in value (decoupled)
    whole_stats, split_stats = whole.step(examples), split.step(examples)
    assert whole_stats.loss == pytest.approx(float(token_losses.sum()) / (4 * 4), rel=1e-5)
    assert split_stats.loss == pytest.approx(whole_stats.loss, rel=1e-5)
    for a, b in zip(whole.model.parameters(), split.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-7, rtol=1e-5)


def test_warmup_raises_exact_match() -> None:
    tokenizer = build_char_tokenizer("0123456789+=")
    model = build_tiny_model(tokenizer, TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128))
    train, _ = addition_problems(seed=0, heldout_size=100)
    memorise = train[:16]
    before = evaluate_exact_match(model, tokenizer, memorise)
    result = supervised_warmup(
        model, tokenizer, memorise, memorise, target_em=0.5, max_steps=300, batch_size=16, lr=1e-2, eval_every=20
    )
    assert result.heldout_em >= 0.5 > before
    assert result.curve[0][2] == before and result.curve[-1][2] == result.heldout_em


@pytest.mark.parametrize(
    ("step", "warmup", "decay", "expected"),
    [
        (0, 4, 0, 0.25),
        (3, 4, 0, 1.0),
        (100, 4, 0, 1.0),
        (4, 4, 10, 1.0),  # decay starts at its peak
        (9, 4, 10, 0.1 + 0.9 * 0.5),  # half-way through the cosine
        (14, 4, 10, 0.1),
        (500, 4, 10, 0.1),  # and stays at the floor
        (0, 0, 10, 1.0),
    ],
)
def test_lr_schedule(step: int, warmup: int, decay: int, expected: float) -> None:
    assert lr_factor(step, warmup, decay, min_lr_ratio=0.1) == pytest.approx(expected)


def test_lr_follows_the_version_so_a_resumed_trainer_keeps_its_schedule() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SMALL)
    example = PolicyExample(
        np.array([4, 5], np.int32), np.array([6, 1], np.int32), np.zeros(2, np.float32), np.ones(2, np.uint8), 1.0
    )
    config = PolicyStepConfig(lr=1e-3, lr_warmup_steps=4, lr_decay_steps=10)
    fresh = PolicyTrainer(copy.deepcopy(model), tokenizer.pad_token_id, config)
    resumed = PolicyTrainer(copy.deepcopy(model), tokenizer.pad_token_id, config, version=9)
    assert fresh.step([example]).lr == pytest.approx(1e-3 * 0.25)
    stats = resumed.step([example])
    assert (stats.version, stats.lr) == (10, pytest.approx(1e-3 * lr_factor(9, 4, 10, 0.1)))


def test_collate_pads_prompts_left_and_responses_right_in_example_order() -> None:
    examples = [
        PolicyExample(np.array([5, 6, 7], np.int32), np.array([8], np.int32), np.array([-0.5], np.float32),
                      np.array([1], np.uint8), 1.0),
        PolicyExample(np.array([], np.int32), np.array([9, 10, 11], np.int32),
                      np.array([-0.1, -0.2, -0.3], np.float32), np.array([1, 0, 1], np.uint8), -2.0),
        PolicyExample(np.array([4], np.int32), np.array([12, 13], np.int32), np.array([-1.0, -2.0], np.float32),
                      np.array([0, 1], np.uint8), 0.5),
    ]  # fmt: skip
    batch = collate(examples, pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 0, 0], [0, 0, 0, 9, 10, 11], [0, 0, 4, 12, 13, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 0, 0, 1, 2], [0, 0, 0, 1, 2, 2]]
    assert batch.response_ids.tolist() == [[8, 0, 0], [9, 10, 11], [12, 13, 0]]
    expected = torch.tensor([[-0.5, 0, 0], [-0.1, -0.2, -0.3], [-1.0, -2.0, 0]])
    assert torch.equal(batch.behaviour_logprobs, expected)
    assert batch.loss_mask.tolist() == [[1, 0, 0], [1, 0, 1], [0, 1, 0]]
    assert batch.advantages.tolist() == [1.0, -2.0, 0.5]
    dtypes = [batch.input_ids.dtype, batch.attention_mask.dtype, batch.response_ids.dtype, batch.loss_mask.dtype]
    assert dtypes == [torch.long, torch.long, torch.long, torch.float32]
