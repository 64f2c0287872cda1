"""``train.backend: torch``: AdamW in this process, on the model's own device."""

from __future__ import annotations

import torch

from astraflow.training.backends.base import TrainerBackend


class TorchBackend(TrainerBackend):
    """``torch.optim.AdamW`` over every parameter, global-norm clipping by ``clip_grad_norm_``."""

    def __init__(
        self, model: torch.nn.Module, lr: float, betas: tuple[float, float], weight_decay: float, max_grad_norm: float
    ) -> None:
        self.model = model
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)

    def sharded_parts(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        return self.model, self.optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self, lr: float) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.zero_grad()
            return float(grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return float(grad_norm)
