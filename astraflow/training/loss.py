"""PPO-clip policy loss with the decoupled importance ratio against the behaviour policy.

Sources: PPO (Schulman et al. 2017) for the clipped surrogate; GRPO (DeepSeekMath, Shao et al.
2024) for using it with group-normalised, sequence-level advantages and no value function; decoupled
PPO (AReaL, Fu et al. 2025) for splitting the ratio in two when samples are stale:

    ρ = π_θ / π_old                 clipped to [1 - eps_low, 1 + eps_high]   (trust region)
    w = min(π_old / π_b, C)          truncated, no gradient                  (off-policy correction)
    loss_t = -w · min(ρ·A, clip(ρ)·A)

π_b is the behaviour policy whose log-probs the rollout engine recorded; π_old is the policy at the
start of the update. Departures and choices:

- With ``proximal_logprobs=None`` π_old is π_θ itself, detached: the one-gradient-step-per-batch
  case of docs/algorithms.md, where ρ = 1 in value (so nothing is clipped) and all the off-policy
  correction sits in w. AReaL recomputes π_old with an extra forward pass instead; passing
  ``proximal_logprobs`` does that. Passing the behaviour log-probs as ``proximal_logprobs`` gives
  the classic PPO clip against π_b (w = 1), as in TRL and prime-rl.
- Truncation (C = ``max_is_weight``) follows truncated importance sampling (IMPALA's ρ̄; Yao et al.
  2025 for LLM RL) rather than AReaL's masking of tokens above the cap.
- Aggregation: ``token-mean`` (DAPO) divides the summed token losses by the batch's token count;
  ``seq-mean-token-mean`` (original GRPO) averages each sequence, then the sequences;
  ``seq-mean-token-sum-norm`` (Dr.GRPO) divides by sequences × a constant token budget.
  ``denominator`` overrides the count (tokens or sequences) when a batch is split into
  micro-batches, so that accumulated gradients equal the full-batch gradient.
- No KL penalty here: ``train.kl`` adds one to this loss in ``PolicyTrainer`` (``training/kl.py``),
  aggregated by ``aggregate`` as this loss is; off by default (β = 0, as in DAPO and TRL's default).

All log-probs must use the same temperature convention as the engine (log_softmax(logits / T)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from astraflow.config import Aggregation


@dataclass
class LossStats:
    """Diagnostics over the trained (mask = 1) tokens of the batch."""

    tokens: int  # trained tokens
    clip_fraction: float  # tokens whose clipped branch is the active one (no gradient)
    ratio_mean: float  # mean of ρ = π_θ / π_old
    is_weight_mean: float  # mean of the truncated weight w
    truncated_fraction: float  # tokens with π_old / π_b > C
    behaviour_kl: float  # k3 estimate of KL(π_b || π_θ): mean of (r - 1) - log r, r = π_θ / π_b


def ppo_clip_loss(
    logprobs: torch.Tensor,  # [B, T] log π_θ of the response tokens, with grad
    behaviour_logprobs: torch.Tensor,  # [B, T] log π_b recorded by the engine
    advantages: torch.Tensor,  # [B] one advantage per sequence, or [B, T] one per token
    mask: torch.Tensor,  # [B, T] 1 for trained tokens, 0 for padding and tool tokens
    *,
    proximal_logprobs: torch.Tensor | None = None,  # [B, T] log π_old; None: π_θ detached
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    max_is_weight: float = 2.0,
    aggregation: Aggregation = "token-mean",
    denominator: float | None = None,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The scalar loss to minimise and its diagnostics (see the module docstring)."""
    mask = mask.to(logprobs.dtype)
    proximal = logprobs.detach() if proximal_logprobs is None else proximal_logprobs
    ratio = torch.exp(logprobs - proximal)  # [B, T]
    raw_weight = torch.exp(proximal - behaviour_logprobs)  # [B, T]
    weight = raw_weight.clamp(max=max_is_weight)
    adv = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logprobs.dtype)  # [B, 1] or [B, T]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -weight * torch.minimum(unclipped, clipped)  # [B, T]
    loss = aggregate(per_token, mask, aggregation, denominator, max_tokens)

    with torch.no_grad():
        count = mask.sum().clamp(min=1.0)

        def masked_mean(values: torch.Tensor) -> float:
            return float((values * mask).sum() / count)

        log_r = logprobs.detach() - behaviour_logprobs
        stats = LossStats(
            tokens=int(mask.sum()),
            clip_fraction=masked_mean((clipped < unclipped).to(mask.dtype)),
            ratio_mean=masked_mean(ratio.detach()),
            is_weight_mean=masked_mean(weight),
            truncated_fraction=masked_mean((raw_weight > max_is_weight).to(mask.dtype)),
            behaviour_kl=masked_mean(torch.exp(log_r) - 1.0 - log_r),
        )
    return loss, stats


def aggregate(
    per_token: torch.Tensor,  # [B, T]
    mask: torch.Tensor,  # [B, T] float
    aggregation: Aggregation,
    denominator: float | None,
    max_tokens: int | None,
) -> torch.Tensor:
    """The batch loss of ``per_token`` over the ``mask``ed tokens, by ``aggregation`` (module docstring)."""
    masked = per_token * mask
    sequences = float(per_token.shape[0])
    if aggregation == "token-mean":
        return masked.sum() / (denominator if denominator is not None else mask.sum().clamp(min=1.0))
    if aggregation == "seq-mean-token-mean":
        per_sequence = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)  # [B]
        return per_sequence.sum() / (denominator if denominator is not None else sequences)
    if aggregation == "seq-mean-token-sum-norm":
        budget = max_tokens if max_tokens is not None else per_token.shape[1]
        return masked.sum() / ((denominator if denominator is not None else sequences) * budget)
    raise ValueError(f"unknown aggregation {aggregation!r}")
