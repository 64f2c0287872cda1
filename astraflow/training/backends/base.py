"""The optimizer side of a trainer, behind one small interface chosen by ``train.backend``.

``PolicyTrainer`` (``astraflow.training.step``) owns the loss; a backend owns everything that
touches parameters: the module the forward pass runs through, ``backward``, the optimizer step
with gradient clipping, and an optimizer object whose ``state_dict`` / ``load_state_dict``
``CheckpointStore`` saves next to the model. That keeps the checkpoint contract one contract:
model, optimizer, offsets, version in one atomic directory, whichever backend trained them.
``backend.model`` is always the plain module the weights belong to; ``full_state`` is what the
trainer publishes and ``model_state`` what checkpoints hold: the model's own ``state_dict`` unless
the backend shards it over ranks (FSDP2), whose full tensors every rank then gathers together.
``frozen`` holds a reference model for the KL term (``training/kl.py``) as the backend holds the
policy, and ``sync_reference`` copies the policy into it, each rank its own part.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.training.checkpoint import OptimizerState, TrainerState, is_deepspeed, load_sharded, save_sharded

if TYPE_CHECKING:
    import torch


class TrainerBackend(ABC):
    """One optimizer over ``model``; the learning rate of each step is set by the caller."""

    model: torch.nn.Module
    optimizer: OptimizerState

    @property
    def module(self) -> torch.nn.Module:
        """What to run the forward pass through (the model itself unless the backend wraps it)."""
        return self.model

    @property
    def model_state(self) -> OptimizerState:
        """What a checkpoint saves and restores of the model (``state_dict`` / ``load_state_dict``): the
        full, unsharded weights. On a sharded backend both are collectives that every rank calls."""
        return self.model

    def sharded_parts(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The module and the torch optimizer a checkpoint of several ranks saves and loads with
        ``torch.distributed.checkpoint`` (``training/checkpoint.py``)."""
        from astraflow.core.errors import ConfigError

        raise ConfigError(
            f"{type(self).__name__} cannot write or read a checkpoint of several ranks "
            "(torch.distributed.checkpoint): train.backend torch or fsdp can"
        )

    @property
    def checkpoints_sharded(self) -> bool:
        """Whether even a trainer of one rank checkpoints with ``save_shards`` (not ``model.pt``)."""
        return False

    def save_shards(self, tmp: Path) -> None:
        """This rank's part of a checkpoint of several ranks into ``tmp`` (a collective every rank calls
        with the same ``tmp``; rank 0 commits it when its call returns): ``torch.distributed.checkpoint``."""
        save_sharded(tmp, *self.sharded_parts())

    def load_shards(self, directory: Path) -> TrainerState:
        """Load a checkpoint that ``save_shards`` wrote, under any world size (a collective); its state."""
        if is_deepspeed(directory):
            from astraflow.core.errors import ConfigError

            raise ConfigError(
                f"{directory} is a checkpoint of the deepspeed backend (DeepSpeed's format): resume it with "
                f"train.backend deepspeed, not with {type(self).__name__}"
            )
        return load_sharded(directory, *self.sharded_parts())

    def check_full_checkpoint(self, directory: Path) -> None:
        """Raise ``ConfigError`` if the full checkpoint (``model.pt``) in ``directory`` cannot load here."""

    def full_state(self) -> Mapping[str, torch.Tensor]:
        """The full weights to publish, by name. On a sharded backend its tensors are gathered one at a
        time as they are read, and every rank reads it through, in the same order."""
        return self.model.state_dict()

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` (an unwrapped copy of the policy's starting weights) made ready for forward passes
        without gradients beside the policy: here on the policy's device and in its dtype; a backend that
        shards the policy shards it alike, so that ``sync_reference`` copies shard to shard."""
        weight = next(self.model.parameters())
        return model.to(device=weight.device, dtype=weight.dtype).requires_grad_(False).eval()

    def sync_reference(self, reference: torch.nn.Module, alpha: float) -> None:
        """reference ← α · policy + (1 − α) · reference, weight by weight, each rank on its own part (the
        reference came from ``frozen``: placed and sharded as the policy is)."""
        import torch

        with torch.no_grad():
            for mine, policy in zip(reference.parameters(), self.model.parameters(), strict=True):
                if alpha == 1.0:
                    mine.copy_(policy)
                else:
                    mine.mul_(1.0 - alpha).add_(policy, alpha=alpha)

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Wraps the forward and backward of one micro-batch; ``last`` marks the step's final one, the
        only one whose gradients a data-parallel backend reduces over the ranks."""
        return contextlib.nullcontext()

    @abstractmethod
    def zero_grad(self) -> None:
        """Forget the gradients of the previous step."""

    @abstractmethod
    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate the gradient of ``loss``; ``last`` marks the final micro-batch of a step."""

    @abstractmethod
    def step(self, lr: float) -> float:
        """Clip the gradients (global norm, the backend's ``max_grad_norm``), update at ``lr``;
        the norm before clipping. When that norm is not finite, nothing is updated (parameters and
        optimizer state stay as they were) and the gradients are dropped."""
