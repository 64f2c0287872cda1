"""Trainer backends, chosen by ``train.backend``: ``torch`` | ``deepspeed`` | ``simulated``.

``build_backend`` is the only place that knows the names; DeepSpeed is imported only when chosen.
``simulated`` computes nothing and sleeps each step's modelled time (capacity planning).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from astraflow.training.backends.base import TrainerBackend

if TYPE_CHECKING:
    import torch

    from astraflow.config import DeepSpeedOptions, SimulatedTrainerOptions

__all__ = ["TrainerBackend", "build_backend"]


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
) -> TrainerBackend:
    """The backend ``name`` over ``model`` with an AdamW of these settings."""
    if name == "torch":
        from astraflow.training.backends.torch_adamw import TorchBackend

        return TorchBackend(model, lr, betas, weight_decay, max_grad_norm)
    if name == "deepspeed":
        from astraflow.config import DeepSpeedOptions
        from astraflow.training.backends.deepspeed_zero import DeepSpeedBackend

        options = deepspeed or DeepSpeedOptions()
        return DeepSpeedBackend(model, lr, betas, weight_decay, max_grad_norm, options.zero_stage, options.offload_optimizer)
    if name == "simulated":
        from astraflow.config import SimulatedTrainerOptions
        from astraflow.training.backends.simulated import SimulatedBackend, TrainTimeModel

        options = simulated or SimulatedTrainerOptions()
        return SimulatedBackend(model, TrainTimeModel.from_options(options), options.time_scale)
    raise ValueError(f"unknown trainer backend {name!r}; choose 'torch', 'deepspeed' or 'simulated'")
