"""PPO-clip loss with the decoupled ratio, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.training.loss import ppo_clip_loss


def _one_token(ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    behaviour = torch.tensor([[-1.0]])
    new = (behaviour + math.log(ratio)).requires_grad_(True)
    return new, behaviour


@pytest.mark.parametrize(
    ("ratio", "advantage", "eps_low", "eps_high", "loss", "clipped"),
    [
        (1.5, 1.0, 0.2, 0.2, -1.2, True),  # above 1 + eps_high with A > 0: clipped, no gradient
        (1.5, -1.0, 0.2, 0.2, 1.5, False),  # above the range with A < 0: the unclipped term is the min
        (0.5, 1.0, 0.2, 0.2, -0.5, False),  # below 1 - eps_low with A > 0: unclipped
        (0.5, -1.0, 0.2, 0.2, 0.8, True),  # below the range with A < 0: clipped
        (1.1, 2.0, 0.2, 0.2, -2.2, False),  # inside the range
        (1.25, 1.0, 0.2, 0.28, -1.25, False),  # clip-higher (DAPO): 1.25 < 1.28
        (0.75, -1.0, 0.2, 0.28, 0.8, True),  # the low side still clips at 0.8
    ],
)
def test_clip_against_behaviour(
    ratio: float, advantage: float, eps_low: float, eps_high: float, loss: float, clipped: bool
) -> None:
    new, behaviour = _one_token(ratio)
    value, stats = ppo_clip_loss(
        new,
        behaviour,
        torch.tensor([advantage]),
        torch.ones(1, 1),
        proximal_logprobs=behaviour,  # classic PPO: ratio against the behaviour policy, w = 1
        eps_low=eps_low,
        eps_high=eps_high,
    )
    value.backward()
    assert float(value.detach()) == pytest.approx(loss, abs=1e-6)
    assert stats.clip_fraction == (1.0 if clipped else 0.0)
    assert stats.ratio_mean == pytest.approx(ratio, abs=1e-6)
    expected_grad = 0.0 if clipped else -advantage * ratio  # d(-ρA)/d log π_θ = -ρA
    assert float(new.grad) == pytest.approx(expected_grad, abs=1e-6)


@pytest.mark.parametrize(
    ("ratio", "weight", "truncated"),
    [(1.0, 1.0, 0.0), (1.5, 1.5, 0.0), (0.5, 0.5, 0.0), (3.0, 2.0, 1.0)],
)
def test_decoupled_weight_is_truncated_and_ratio_is_one(ratio: float, weight: float, truncated: float) -> None:
    new, behaviour = _one_token(ratio)  # π_θ / π_b = ratio; π_old = π_θ (detached)
    value, stats = ppo_clip_loss(new, behaviour, torch.tensor([1.0]), torch.ones(1, 1), max_is_weight=2.0)
    value.backward()
    assert float(value.detach()) == pytest.approx(-weight, abs=1e-6)
    assert float(new.grad) == pytest.approx(-weight, abs=1e-6)  # w · ∇ log π_θ, never clipped
    assert stats.ratio_mean == pytest.approx(1.0)
    assert stats.is_weight_mean == pytest.approx(weight, abs=1e-6)
    assert stats.truncated_fraction == truncated
    assert stats.behaviour_kl == pytest.approx(ratio - 1 - math.log(ratio), abs=1e-6)


def test_masked_tokens_are_ignored() -> None:
    behaviour = torch.tensor([[-1.0, -1.0, -1.0]])
    new = torch.tensor([[-1.0, 50.0, -1.0 + math.log(1.1)]], requires_grad=True)
    value, stats = ppo_clip_loss(
        new, behaviour, torch.tensor([1.0]), torch.tensor([[1.0, 0.0, 1.0]]), proximal_logprobs=behaviour
    )
    value.backward()
    assert float(value.detach()) == pytest.approx(-(1.0 + 1.1) / 2, abs=1e-6)
    assert stats.tokens == 2 and stats.clip_fraction == 0.0
    assert float(new.grad[0, 1]) == 0.0


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token-mean", (-1.0 + 3 * 1.0) / 4),  # four tokens
        ("seq-mean-token-mean", (-1.0 + 1.0) / 2),  # each sequence averages to ∓1
        ("seq-mean-token-sum-norm", (-1.0 + 3 * 1.0) / (2 * 5)),  # Dr.GRPO: 2 sequences × budget 5
    ],
)
def test_aggregations(aggregation: str, expected: float) -> None:
    logprobs = torch.full((2, 3), -0.5)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    value, _ = ppo_clip_loss(
        logprobs,
        logprobs,
        torch.tensor([1.0, -1.0]),
        mask,
        aggregation=aggregation,
        max_tokens=5,  # type: ignore[arg-type]
    )
    assert float(value.detach()) == pytest.approx(expected, abs=1e-6)
