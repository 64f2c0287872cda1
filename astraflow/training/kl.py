"""A KL penalty to a reference policy (``train.kl``): the per-token estimators, the loss term, its
coefficient, and the frozen reference model it is measured against.

    loss = policy loss + β · agg(k_t)       k_t: a one-token estimate of KL(π_θ ‖ π_ref)

agg is the policy loss's own aggregation over the same trained tokens (``loss.aggregate``), so a
micro-batch's term is its share of the whole batch's, as the policy loss is. Estimators of
KL(π_θ ‖ π_ref) = E_{y~π_θ}[log π_θ(y) − log π_ref(y)] from one sampled token y, with
log r = log π_ref(y) − log π_θ(y) (Schulman, "Approximating KL Divergence", 2020):

    k1 = −log r                 unbiased; high variance; negative on some tokens
    k2 = ½ (log r)²             biased (KL to second order); low variance; never negative
    k3 = (r − 1) − log r        unbiased (E[r] = 1); low variance; never negative (TRL's GRPO term)
    low_var_kl                  k3 with log r clamped to [−20, 20] and the result to [−10, 10] (verl's)

As loss terms their gradients are not their values': over tokens of π_θ, E[∇k1] = 0,
E[∇k2] = ∇KL(π_θ ‖ π_ref) and E[∇k3] = ∇KL(π_ref ‖ π_θ), the reverse direction
(``tests/unit/test_kl_penalty.py`` checks all three exactly on a small vocabulary). Departures and choices:

- The tokens are the behaviour policy π_b's, and the term is not importance-weighted (as in verl
  and TRL): with one gradient step per batch and little staleness π_b ≈ π_θ.
- β is fixed, or adaptive (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
  Preferences", arXiv:1909.08593, as verl's ``AdaptiveKLController``), here on the loss's
  coefficient where verl steers the KL it subtracts from the reward.
- The reference is the base checkpoint, or the policy itself re-synced every N versions, mixed
  π_ref ← α π_θ + (1 − α) π_ref (TRL's ``sync_ref_model``, from TR-DPO: Gorbatovski et al. 2024,
  "Learn Your Reference Model for Real Good Alignment", arXiv:2404.09656). Each rank holds it as it
  holds the policy (``TrainerBackend.frozen``), so a sync is a copy of each rank's own shards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from astraflow.config import AdaptiveKlOptions, Aggregation, KlConfig, KlEstimator
from astraflow.training.loss import aggregate

if TYPE_CHECKING:
    from astraflow.training.backends.base import TrainerBackend

LOG_RATIO_BOUND = 20.0
"""``low_var_kl``: log r is clamped to ±this before exp (verl's numerical guard)."""
LOW_VAR_BOUND = 10.0
"""``low_var_kl``: the estimate is clamped to ±this (verl's)."""
MAX_STEP_CHANGE = 0.2
"""The adaptive coefficient's proportional error is clipped to ±this (Ziegler et al.)."""


def kl_estimate(
    logprobs: torch.Tensor,  # [B, T] log π_θ of the sampled tokens
    reference_logprobs: torch.Tensor,  # [B, T] log π_ref of the same tokens
    estimator: KlEstimator,
) -> torch.Tensor:  # [B, T]
    """The per-token estimate of KL(π_θ ‖ π_ref) (module docstring); with grad through ``logprobs``."""
    log_r = reference_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        return torch.expm1(log_r) - log_r
    if estimator == "low_var_kl":
        log_r = log_r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return (torch.expm1(log_r) - log_r).clamp(-LOW_VAR_BOUND, LOW_VAR_BOUND)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose 'k1', 'k2', 'k3' or 'low_var_kl'")


def kl_term(
    logprobs: torch.Tensor,  # [B, T] with grad
    reference_logprobs: torch.Tensor,  # [B, T] no grad
    mask: torch.Tensor,  # [B, T] 1 for trained tokens
    estimator: KlEstimator,
    aggregation: Aggregation = "token-mean",
    denominator: float | None = None,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, float]:
    """The KL term before β, aggregated as the policy loss (``loss.aggregate``), and the sum of the
    estimate over the trained tokens (the step's mean KL is its sum over micro-batches and ranks
    divided by their tokens)."""
    mask = mask.to(logprobs.dtype)
    per_token = kl_estimate(logprobs, reference_logprobs, estimator)
    term = aggregate(per_token, mask, aggregation, denominator, max_tokens)
    return term, float((per_token.detach() * mask).sum())


class KlCoefficient:
    """β: ``value`` stays as it is, or with ``adaptive`` follows the KL toward its target after each step."""

    def __init__(self, value: float, adaptive: AdaptiveKlOptions | None = None) -> None:
        self.value = value
        self.adaptive = adaptive

    def update(self, kl: float, samples: int) -> None:
        """After a step whose mean KL per trained token was ``kl``, over ``samples`` samples:
        β ← β · (1 + clip(kl / target − 1, ±0.2) · samples / horizon)."""
        if self.adaptive is None:
            return
        error = min(max(kl / self.adaptive.target - 1.0, -MAX_STEP_CHANGE), MAX_STEP_CHANGE)
        self.value *= 1.0 + error * samples / self.adaptive.horizon


class KlPenalty:
    """The KL term of a ``PolicyTrainer``: its options, the frozen reference model (placed and sharded
    by ``backend.frozen``), the coefficient, and the reference's syncs."""

    def __init__(self, options: KlConfig, reference: torch.nn.Module, backend: TrainerBackend) -> None:
        self.options = options
        self.reference = reference
        """What the reference's forward pass runs through (no gradients, eval mode)."""
        self.backend = backend
        self.coefficient = KlCoefficient(options.coef, options.adaptive)

    def term(
        self,
        logprobs: torch.Tensor,  # [B, T] with grad
        reference_logprobs: torch.Tensor,  # [B, T]
        mask: torch.Tensor,  # [B, T]
        aggregation: Aggregation,
        denominator: float | None,
        max_tokens: int | None,
    ) -> tuple[torch.Tensor, float]:
        """β times the KL term (to add to the loss), and the estimate's sum over the trained tokens."""
        term, total = kl_term(
            logprobs, reference_logprobs, mask, self.options.estimator, aggregation, denominator, max_tokens
        )
        return self.coefficient.value * term, total

    def after_step(self, version: int, kl: float, samples: int) -> None:
        """The step that produced ``version`` had mean KL ``kl`` over ``samples`` samples: update β, and
        re-sync a ``sync`` reference when ``version`` is a multiple of ``sync_every`` (every rank alike)."""
        self.coefficient.update(kl, samples)
        every = self.options.sync_every
        if self.options.reference == "sync" and every and version % every == 0:
            self.backend.sync_reference(self.reference, self.options.sync_mixup)

    def resume(self, coef: float | None) -> None:
        """After a checkpoint is loaded: take its adaptive β (``coef``; a fixed β stays the configured
        one), and copy the restored weights into a ``sync`` reference, whose own weights no checkpoint
        keeps (a ``base`` reference is the base checkpoint's already)."""
        if coef is not None and self.options.adaptive is not None:
            self.coefficient.value = coef
        if self.options.reference == "sync":
            self.backend.sync_reference(self.reference, 1.0)
