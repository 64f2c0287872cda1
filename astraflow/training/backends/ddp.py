"""``train.backend: torch`` with several ranks: DistributedDataParallel over the torch AdamW backend.

Every rank holds the whole model and the whole optimizer state; after a step's last micro-batch
DDP all-reduces (averages) the gradients, so each rank's AdamW takes the same update and the
replicas stay equal without ever being compared. Earlier micro-batches run under ``no_sync``: one
reduction per step. Checkpoints and published weights are therefore those of the plain module,
exactly as with one rank, so a checkpoint resumes under any world size.

``forward_sync_buffers`` is off: the model's buffers (rotary frequencies) never change, and a broadcast
at each forward would be a collective more per micro-batch.
"""

from __future__ import annotations

import contextlib

import torch

from astraflow.training.backends.torch_adamw import TorchBackend


class DdpBackend(TorchBackend):
    """``TorchBackend`` whose forward and backward run through ``DistributedDataParallel``."""

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        max_grad_norm: float,
        device: torch.device,
    ) -> None:
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(model, lr, betas, weight_decay, max_grad_norm)
        device_ids = [device.index] if device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)

    @property
    def module(self) -> torch.nn.Module:
        return self.ddp

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else self.ddp.no_sync()
