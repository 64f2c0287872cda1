"""The KL term to a reference policy (``train.kl``, ``training/kl.py``): its estimators against the exact
KL on a small vocabulary, its aggregation, its coefficient, its config, and the trainer that holds it.

The exact expectations over a 6-token vocabulary are sums, not samples: KL(π ‖ ρ) = Σ π log(π / ρ), the
mean of an estimator Σ π k, the mean of its gradient Σ π ∇k with π held fixed as the sampling weights.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import AdaptiveKlOptions, KlConfig, load_config, parse_config
from astraflow.consumers.trainer.component import Trainer
from astraflow.core.errors import ConfigError
from astraflow.core.metric_names import TRAIN_KL, TRAIN_KL_COEF
from astraflow.core.rundir import RunDir
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.training.checkpoint import TrainerState, read_latest_state
from astraflow.training.kl import KlCoefficient, kl_estimate, kl_term
from astraflow.training.loss import aggregate
from astraflow.training.step import PolicyStepConfig, PolicyTrainer, random_examples
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import REPO, send_samples, stopping_at, tiny_math_config

ESTIMATORS = ["k1", "k2", "k3", "low_var_kl"]
PARTINGS = [0.0, 0.25, 0.5, 1.0, 2.0]
"""How far apart the two policies' logits are set (``pair``): 0 is the same policy."""


def pair(parting: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of a policy and a reference over 6 tokens, their logits ``parting`` times a fixed direction apart."""
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 0.2], dtype=torch.float64)
    direction = torch.tensor([-1.0, 0.8, 0.3, 1.2, -0.4, 0.0], dtype=torch.float64)
    return torch.log_softmax(logits, -1), torch.log_softmax(logits + parting * direction, -1)


def exact_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = Σ p log(p / q)."""
    return (log_p.exp() * (log_p - log_q)).sum()


def expected(log_p: torch.Tensor, log_q: torch.Tensor, estimator: str) -> torch.Tensor:
    """The mean of ``estimator`` over tokens drawn from p: Σ p k (p held fixed, as sampling weights)."""
    return (log_p.detach().exp() * kl_estimate(log_p, log_q, estimator)).sum()


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimate_is_zero_where_the_policy_is_the_reference(estimator: str) -> None:
    logprobs = -torch.rand(4, 7) * 5
    assert torch.equal(kl_estimate(logprobs, logprobs.clone(), estimator), torch.zeros(4, 7))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_expected_estimate_grows_as_the_policies_part(estimator: str) -> None:
    means = [float(expected(*pair(parting), estimator)) for parting in PARTINGS]
    assert means[0] == 0.0
    assert all(later > earlier for earlier, later in zip(means, means[1:])), means


@pytest.mark.parametrize("estimator", ["k2", "k3", "low_var_kl"])
def test_a_token_estimate_is_never_negative_and_grows_with_the_log_ratio_either_way(estimator: str) -> None:
    log_r = torch.tensor([0.0, 0.1, 0.5, 1.0, 3.0], dtype=torch.float64)
    for sign in (1.0, -1.0):
        values = kl_estimate(torch.zeros_like(log_r), sign * log_r, estimator)
        assert values[0] == 0.0 and bool((values[1:] > 0).all())
        assert bool((values.diff() > 0).all()), values


@pytest.mark.parametrize("parting", PARTINGS[1:])
def test_k1_and_k3_are_unbiased_and_k2_is_not(parting: float) -> None:
    log_p, log_q = pair(parting)
    kl = float(exact_kl(log_p, log_q))
    assert float(expected(log_p, log_q, "k1")) == pytest.approx(kl, rel=1e-12)
    assert float(expected(log_p, log_q, "k3")) == pytest.approx(kl, rel=1e-12)  # E[r] = Σ q = 1
    assert float(expected(log_p, log_q, "k2")) != pytest.approx(kl, rel=1e-3)


def test_the_k3_mean_over_sampled_tokens_matches_the_exact_kl() -> None:
    log_p, log_q = pair(1.0)
    tokens = torch.multinomial(log_p.exp(), 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    k3 = kl_estimate(log_p[tokens], log_q[tokens], "k3")
    standard_error = float(k3.std()) / len(tokens) ** 0.5
    assert abs(float(k3.mean()) - float(exact_kl(log_p, log_q))) < 4 * standard_error
    assert standard_error < 0.01 * float(exact_kl(log_p, log_q))  # the check is tight


@pytest.mark.parametrize(
    ("estimator", "gradient_of"),
    [("k1", None), ("k2", "forward"), ("k3", "reverse")],
)
def test_each_estimate_as_a_loss_has_the_gradient_the_docs_give_it(estimator: str, gradient_of: str | None) -> None:
    """Over tokens of π: E[∇k1] = 0, E[∇k2] = ∇KL(π ‖ ρ), E[∇k3] = ∇KL(ρ ‖ π) (``training/kl.py``)."""
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 0.2], dtype=torch.float64, requires_grad=True)
    _, log_q = pair(1.0)
    log_p = torch.log_softmax(logits, -1)
    (mean_gradient,) = torch.autograd.grad(expected(log_p, log_q, estimator), logits)
    if gradient_of is None:
        assert torch.allclose(mean_gradient, torch.zeros(6, dtype=torch.float64), atol=1e-12)
        return
    log_p = torch.log_softmax(logits, -1)
    kl = exact_kl(log_p, log_q) if gradient_of == "forward" else exact_kl(log_q, log_p)
    (true_gradient,) = torch.autograd.grad(kl, logits)
    assert torch.allclose(mean_gradient, true_gradient, atol=1e-12)


def test_low_var_kl_is_k3_clamped_to_ten() -> None:
    logprobs = torch.zeros(5)
    reference = torch.tensor([-30.0, -2.0, 0.0, 2.0, 30.0])
    k3 = kl_estimate(logprobs, reference, "k3")
    low_var = kl_estimate(logprobs, reference, "low_var_kl")
    assert torch.equal(low_var[1:4], k3[1:4])
    assert low_var[0] == 10.0 and low_var[4] == 10.0 and k3[0] > 10.0 and k3[4] > 1e12


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_term_is_masked_and_aggregated_as_the_policy_loss(aggregation: str) -> None:
    logprobs, reference = -torch.rand(3, 5) * 2, -torch.rand(3, 5) * 2
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float32)
    term, total = kl_term(logprobs, reference, mask, "k3", aggregation, max_tokens=8)
    per_token = kl_estimate(logprobs, reference, "k3")
    assert float(term) == pytest.approx(float(aggregate(per_token, mask, aggregation, None, 8)))
    assert total == pytest.approx(float((per_token * mask).sum()))
    moved = reference.clone()
    moved[mask == 0] -= 5.0  # a masked token counts for nothing
    assert float(kl_term(logprobs, moved, mask, "k3", aggregation, max_tokens=8)[0]) == pytest.approx(float(term))


@pytest.mark.parametrize(
    ("kl", "factor"),
    [
        (0.12, 1 + 0.2 * 64 / 1000),  # above the target: β rises, by at most 20% of samples / horizon
        (0.11, 1 + 0.1 * 64 / 1000),
        (0.10, 1.0),
        (0.09, 1 - 0.1 * 64 / 1000),
        (0.0, 1 - 0.2 * 64 / 1000),  # below it: β falls
    ],
)
def test_the_adaptive_coefficient_moves_toward_the_target(kl: float, factor: float) -> None:
    coefficient = KlCoefficient(0.05, AdaptiveKlOptions(target=0.1, horizon=1000))
    coefficient.update(kl, samples=64)
    assert coefficient.value == pytest.approx(0.05 * factor)
    fixed = KlCoefficient(0.05)
    fixed.update(kl, samples=64)
    assert fixed.value == 0.05


@pytest.mark.parametrize(
    ("kl", "names"),
    [
        ({"coef": -0.1}, "train.kl.coef"),
        ({"estimator": "k4"}, "train.kl.estimator"),
        ({"reference": "sft"}, "train.kl.reference"),
        ({"coef": 0.1, "reference": "sync"}, "train.kl.sync_every: reference 'sync' needs it"),
        ({"coef": 0.1, "sync_every": 4}, "train.kl.sync_every: only reference 'sync'"),
        ({"coef": 0.1, "sync_mixup": 0.6}, "train.kl.sync_mixup: only reference 'sync'"),
        ({"coef": 0.1, "reference": "sync", "sync_every": 0}, "train.kl.sync_every"),
        ({"coef": 0.1, "reference": "sync", "sync_every": 2, "sync_mixup": 0.0}, "train.kl.sync_mixup"),
        ({"adaptive": {"target": 0.1}}, "train.kl.adaptive: needs train.kl.coef above 0"),
        ({"coef": 0.1, "adaptive": {"target": 0.0}}, "train.kl.adaptive.target"),
        ({"coef": 0.1, "adaptive": {"horizon": 0}}, "train.kl.adaptive.horizon"),
        ({"coef": 0.1, "beta": 0.1}, "train.kl.beta"),
    ],
)
def test_a_bad_kl_option_names_the_field(kl: dict, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"train": {"kl": kl}})
    assert names in str(info.value)


def test_the_term_is_off_by_default_and_in_the_math_example() -> None:
    assert parse_config({}).train.kl == KlConfig() and KlConfig().coef == 0.0
    assert load_config(REPO / "examples" / "math" / "config.yaml").train.kl.coef == 0.0
    config = parse_config({"train": {"kl": {"coef": 0.01, "reference": "sync", "sync_every": 8}}})
    assert config.train.kl.sync_mixup == 1.0 and config.train.kl.estimator == "k3"


def tiny_trainer(kl: KlConfig, lr: float = 1e-2) -> PolicyTrainer:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, seed=3))
    return PolicyTrainer(model, tokenizer.pad_token_id, PolicyStepConfig(lr=lr, lr_warmup_steps=0, kl=kl))


def weights_equal(one: torch.nn.Module, other: torch.nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(one.parameters(), other.parameters(), strict=True))


def test_a_trainer_starts_at_zero_kl_parts_from_its_reference_and_syncs_it() -> None:
    examples = random_examples(len(build_char_tokenizer()), count=8, prompt=4, response=5)
    plain = tiny_trainer(KlConfig())
    trainer = tiny_trainer(KlConfig(coef=0.5, reference="sync", sync_every=2))
    assert plain.kl is None and plain.kl_coef is None and trainer.kl_coef == 0.5
    first = trainer.step(examples)
    assert first.loss_stats["kl"] == pytest.approx(0.0, abs=1e-9) and first.loss_stats["kl_coef"] == 0.5
    assert first.loss == pytest.approx(plain.step(examples).loss, abs=1e-6)  # the policy loss alone
    assert trainer.step(examples).loss_stats["kl"] > 1e-4  # version 2: parted, then synced
    assert weights_equal(trainer.kl.reference, trainer.model)
    assert trainer.step(examples).loss_stats["kl"] == pytest.approx(0.0, abs=1e-9)
    assert not weights_equal(trainer.kl.reference, trainer.model)  # version 3 is no multiple of 2


def test_a_resumed_trainer_takes_the_adaptive_coefficient_and_resyncs_its_reference() -> None:
    options = KlConfig(coef=0.5, reference="sync", sync_every=100, adaptive=AdaptiveKlOptions(target=1.0, horizon=8))
    trainer = tiny_trainer(options)
    trainer.step(random_examples(len(build_char_tokenizer()), count=8, prompt=4, response=5))
    assert trainer.kl_coef == pytest.approx(0.5 * (1 - 0.2 * 8 / 8))  # far below the target
    assert not weights_equal(trainer.kl.reference, trainer.model)
    trainer.resume_kl(0.3)
    assert trainer.kl_coef == 0.3 and weights_equal(trainer.kl.reference, trainer.model)
    fixed = tiny_trainer(KlConfig(coef=0.5))
    fixed.resume_kl(0.3)  # a fixed β is the config's, whatever a checkpoint kept
    assert fixed.kl_coef == 0.5


def test_the_state_keeps_the_coefficient_and_reads_without_one() -> None:
    state = TrainerState(3, {0: 30}, 42, epoch=2, published_full=True, kl_coef=0.07)
    assert TrainerState.from_json(state.to_json()) == state
    old = '{"version": 2, "offsets": {"0": 16}, "trained_samples": 16, "epoch": 1, "published_full": true}'
    assert TrainerState.from_json(old).kl_coef is None


def test_the_trainer_reports_the_kl_each_version_and_a_restart_keeps_its_coefficient(tmp_path: Path) -> None:
    kl = {"coef": 0.2, "reference": "base", "adaptive": {"target": 0.5, "horizon": 16}}
    config = tiny_math_config(tmp_path, {"run": "kl", "train": {"checkpoint_every": 1, "batch_samples": 8, "kl": kl}})
    ctx = ComponentContext(config, tmp_path / "run", "train")
    try:
        send_samples(ctx, recorded_samples(24))
        stop = threading.Event()
        first = stopping_at(Trainer(ctx, "main"), 2, stop)
        first.run(stop)
        metrics = [record for _, record in decode_snapshot(ctx.log, ctx.topics.metrics(ctx.role))]
        reported = {name: [(m.step, m.value) for m in metrics if m.name == name] for name in (TRAIN_KL, TRAIN_KL_COEF)}
        assert [step for step, _ in reported[TRAIN_KL]] == [1, 2] == [step for step, _ in reported[TRAIN_KL_COEF]]
        assert reported[TRAIN_KL][0][1] == pytest.approx(0.0, abs=1e-6) and reported[TRAIN_KL][1][1] > 0.0
        assert np.allclose([value for _, value in reported[TRAIN_KL_COEF]], [0.2, 0.2 * 0.9])
        saved = read_latest_state(RunDir(ctx.run_dir).checkpoints("main")).kl_coef
        assert saved == pytest.approx(first.learner.kl_coef) and saved == pytest.approx(0.2 * 0.9 * 0.9)
        second = Trainer(ctx, "main")  # restores the checkpoint of version 2
        second.transactions.close()
        assert second.learner.kl_coef == saved
        assert not weights_equal(second.learner.kl.reference, second.learner.model)  # the base, still
    finally:
        ctx.close()
