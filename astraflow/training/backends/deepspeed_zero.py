"""``train.backend: deepspeed``: DeepSpeed ZeRO stage 0/1/2, optionally with the optimizer on the CPU.

One trainer process is one data-parallel rank. Without a launcher (the usual case here) it is a
world of one: ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` default to a local
single-process group, with gloo on CPU (DeepSpeed's CPU accelerator) and NCCL on GPUs. Training
stays fp32, so the result follows the torch backend's AdamW step for step; ZeRO only changes
where optimizer state and gradients live.

Micro-batches: ``PolicyTrainer`` already divides each micro-batch's loss by the whole batch's
token count, so gradients are summed, never averaged by DeepSpeed: the engine runs with
``gradient_accumulation_steps: 1``, ``backward`` marks only the last micro-batch as the
accumulation boundary (where ZeRO reduces), and ``step`` runs once per optimizer step.

Checkpoints keep ``CheckpointStore``'s contract (model, optimizer, offsets in one atomic
directory). ``optimizer.state_dict()`` is the wrapped torch optimizer's state (tensors and
numbers only, so ``torch.load(weights_only=True)`` reads it); ``load_state_dict`` puts it back
through ZeRO's own loader and rebuilds ZeRO's fp32 master copy from the model's parameters,
which ``CheckpointStore.restore`` loads first. The model is fp32, so that copy is exact.

First use JIT-compiles DeepSpeed's ops (30-75 s on 2 cores); ``TORCH_EXTENSIONS_DIR`` defaults to
``$ASTRAFLOW_CACHE/torch_extensions`` so that happens once per machine.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from astraflow.errors import MissingDependencyError
from astraflow.rundir import cache_root
from astraflow.training.backends.base import TrainerBackend

if TYPE_CHECKING:
    import torch

INSTALL_HINT = "deepspeed is not installed: run `scripts/setup.sh deepspeed` (or `pip install astraflow[deepspeed]`)"


def _prepare_environment() -> None:
    """Defaults for a single-process run: extension cache, accelerator, rendezvous of a world of one."""
    import torch

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root() / "torch_extensions"))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    for name, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(name, value)


class _ZeroOptimizerState:
    """``state_dict`` / ``load_state_dict`` of a ZeRO optimizer, in a form ``weights_only`` loads."""

    def __init__(self, zero) -> None:
        self.zero = zero

    def state_dict(self) -> dict:
        return {"base_optimizer_state": self.zero.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        full = self.zero.state_dict()  # the live layout (paddings, partition count) this run already has
        full["base_optimizer_state"] = state["base_optimizer_state"]
        self.zero.load_state_dict([full], load_optimizer_states=True, load_from_fp32_weights=False)


class DeepSpeedBackend(TrainerBackend):
    """A ``deepspeed.initialize`` engine over ``model`` with an AdamW of the given settings."""

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        max_grad_norm: float,
        zero_stage: int = 2,
        offload_optimizer: bool = False,
    ) -> None:
        _prepare_environment()
        try:
            import deepspeed
        except ImportError as exc:
            raise MissingDependencyError(INSTALL_HINT) from exc
        import torch

        if offload_optimizer and zero_stage == 0:
            raise ValueError("optimizer offload needs ZeRO stage 1 or 2")
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(
                dist_backend="nccl" if torch.cuda.is_available() else "gloo", auto_mpi_discovery=False
            )
        if offload_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(
                model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay, adamw_mode=True
            )
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        zero: dict = {"stage": zero_stage}
        if offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu"}
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": max_grad_norm,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
        }
        self.model = model
        self.zero_stage = zero_stage
        self.engine, engine_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.optimizer = _ZeroOptimizerState(engine_optimizer) if zero_stage > 0 else engine_optimizer
        self._param_groups = engine_optimizer.param_groups

    @property
    def module(self) -> torch.nn.Module:
        return self.engine

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def step(self, lr: float) -> float:
        for group in self._param_groups:
            group["lr"] = lr
        if self.zero_stage == 0:  # DeepSpeed clips but does not report the norm without ZeRO
            import torch

            norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
            if not torch.isfinite(norm):
                self.engine.zero_grad()
                return float(norm)
        self.engine.step()  # ZeRO: an invalid norm counts as an overflow, and the step is skipped
        if self.zero_stage > 0:
            norm = self.engine.get_global_grad_norm()
        return float(norm)
