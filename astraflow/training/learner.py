"""The learner of a trainer: the loss over an optimizer backend, chosen by ``train.backend``.

``torch`` (DDP with several ranks) | ``fsdp`` | ``deepspeed`` | ``simulated``: ``build_backend`` and
``build_learner`` are the only places that know the names; DeepSpeed and FSDP2 are imported only when
chosen. ``step_config`` is the one place that turns the ``train`` section into the learner's
``PolicyStepConfig``. A ``Learner`` is what the trainer steps: ``PolicyTrainer`` (the PPO-clip loss,
then the backend's optimizer step), or the simulated backend's ``SimulatedLearner``, which computes
nothing and sleeps each step's modelled time.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from astraflow.config import DeepSpeedOptions, FsdpOptions, RolloutConfig, SimulatedTrainerOptions, TrainConfig
from astraflow.training.backends.base import OptimizerState, TrainerBackend
from astraflow.training.backends.deepspeed_zero import DeepSpeedBackend
from astraflow.training.backends.simulated import SimulatedBackend, SimulatedLearner, TrainTimeModel
from astraflow.training.backends.torch_adamw import TorchBackend
from astraflow.training.distributed import SINGLE, Ranks, rank_device
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer, StepStats

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


class Learner(Protocol):
    """What a trainer steps: ``version`` counts optimizer steps; ``model`` holds the current weights."""

    version: int
    model: PreTrainedModel
    optimizer: OptimizerState
    backend: TrainerBackend

    def step(self, examples: Sequence[PolicyExample]) -> StepStats:
        """One optimizer step on all of ``examples``; ``version`` grows by one."""

    @property
    def kl_coef(self) -> float | None:
        """β of the next step's KL term (``train.kl``), which checkpoints keep; ``None`` without one."""

    def resume_kl(self, coef: float | None) -> None:
        """After a checkpoint is loaded: its β, and the KL term's reference made whole again."""


def step_config(train: TrainConfig, rollout: RolloutConfig) -> PolicyStepConfig:
    """The learner's settings from a policy's ``train`` and ``rollout`` sections.

    ``train.loss`` goes in as it is (its fields are named as ``PolicyStepConfig``'s); an unset
    ``train.loss.max_tokens`` becomes ``rollout.max_new_tokens``, the longest response the policy
    samples, so Dr.GRPO's budget is a constant and not a batch's padded width. The top-level
    ``train`` fields keep the names of the YAML they have always had; the temperature must be the
    engine's (``training/step.py``).
    """
    loss = train.loss.model_dump()
    loss["max_tokens"] = train.loss.max_tokens or rollout.max_new_tokens
    return PolicyStepConfig(
        kl=train.kl,
        lr=train.lr,
        lr_warmup_steps=train.lr_warmup_versions,
        lr_decay_steps=train.lr_decay_versions,
        min_lr_ratio=train.min_lr_ratio,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        eps_low=train.clip_low,
        eps_high=train.clip_high,
        temperature=rollout.temperature,
        **loss,
    )


def build_backend(
    name: str,
    model: torch.nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    max_grad_norm: float,
    deepspeed: DeepSpeedOptions | None = None,
    simulated: SimulatedTrainerOptions | None = None,
    fsdp: FsdpOptions | None = None,
    ranks: Ranks = SINGLE,
) -> TrainerBackend:
    """The backend ``name`` over ``model`` with an AdamW of these settings, for ``ranks`` (the
    ``torch`` backend of several ranks is DDP; ``fsdp`` and DDP move ``model`` to the rank's device)."""
    if name == "torch" and not ranks.distributed:
        return TorchBackend(model, lr, betas, weight_decay, max_grad_norm)
    if name == "torch":
        from astraflow.training.backends.ddp import DdpBackend

        device = rank_device(ranks)
        return DdpBackend(model.to(device), lr, betas, weight_decay, max_grad_norm, device)
    if name == "fsdp":
        from astraflow.training.backends.fsdp import FsdpBackend

        options = fsdp or FsdpOptions()
        model = model.to(rank_device(ranks))
        return FsdpBackend(model, lr, betas, weight_decay, max_grad_norm, ranks, options.mixed_precision)
    if name == "deepspeed":
        options = deepspeed or DeepSpeedOptions()
        return DeepSpeedBackend(
            model,
            lr,
            betas,
            weight_decay,
            max_grad_norm,
            options.zero_stage,
            options.offload_optimizer,
            ranks,
            options.mixed_precision,
        )
    if name == "simulated":
        options = simulated or SimulatedTrainerOptions()
        return SimulatedBackend(model, TrainTimeModel.from_options(options), options.time_scale)
    raise ValueError(f"unknown trainer backend {name!r}; choose 'torch', 'fsdp', 'deepspeed' or 'simulated'")


def build_learner(
    name: str,
    model: PreTrainedModel,
    pad_id: int,
    config: PolicyStepConfig,
    *,
    deepspeed: DeepSpeedOptions | None = None,
    simulated: SimulatedTrainerOptions | None = None,
    fsdp: FsdpOptions | None = None,
    ranks: Ranks = SINGLE,
) -> Learner:
    """The learner of backend ``name`` over ``model``, with the optimizer settings of ``config``; with
    several ``ranks`` each one trains its share of every batch (``PolicyTrainer.step``). With a KL term
    (``config.kl``) the reference is a copy of ``model`` taken before the backend wraps it."""
    reference = copy.deepcopy(model) if config.kl.coef > 0.0 and name != "simulated" else None
    backend = build_backend(
        name,
        model,
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        deepspeed=deepspeed,
        simulated=simulated,
        fsdp=fsdp,
        ranks=ranks,
    )
    if isinstance(backend, SimulatedBackend):
        return SimulatedLearner(model, pad_id, config, backend)
    return PolicyTrainer(backend.model, pad_id, config, backend=backend, ranks=ranks, reference=reference)
