"""``train.backend: deepspeed``: DeepSpeed ZeRO stage 0-3 over the trainer's ranks, optionally with the
optimizer on the CPU.

Each trainer rank is one data-parallel rank of DeepSpeed, in the process group the trainer's ranks
form (``init_group``: gloo on CPU, NCCL on GPUs; a world of one on loopback outside a launcher). ZeRO
1 shards the AdamW states over the ranks, 2 the gradients too, 3 the parameters too: under ZeRO-3 a
forward gathers each layer's weights and frees them after it. Training stays fp32, so the result
follows the torch backend's AdamW step for step; ZeRO only changes where optimizer state, gradients
and weights live.

Micro-batches: ``PolicyTrainer`` already divides each micro-batch's loss by the whole batch's
token count (and multiplies it by the world size, as DeepSpeed averages gradients over the ranks),
so the engine runs with ``gradient_accumulation_steps: 1``, ``backward`` marks only the last
micro-batch as the accumulation boundary (where ZeRO reduces), and ``step`` runs once per step.

Published weights (``full_state``): under ZeRO-3 every rank reads them together and each tensor is
gathered (``GatheredParameters``) and copied alone, so no rank holds a second full copy of the model;
under ZeRO 0-2 every rank has the whole model already.

Checkpoints are DeepSpeed's own (``engine.save_checkpoint`` into the checkpoint's ``deepspeed/``
folder: every rank writes its own partitions of the weights and of the optimizer state; see
``training/checkpoint.py``), whatever the world size. To resume, rank 0 converts the checkpoint to
DeepSpeed's *universal* format (``ds_to_universal``: one file per parameter and optimizer state,
independent of the ranks that wrote it) in a scratch folder and every rank loads its partitions of
it, so a checkpoint of 2 ranks resumes under 1 and one of 1 rank under 2 (the ZeRO stage must stay
the same). A full checkpoint (``model.pt``) that an earlier single-rank trainer wrote still loads
into one rank at stage 0-2.

The KL term's reference model (``frozen``) is held as the policy is: a plain copy beside the engine at ZeRO
0-2 (in its dtype), an engine of its own without an optimizer at ZeRO-3 (as OpenRLHF builds its reference),
whose parameters are partitioned as the policy's are; a sync there copies each rank's partition of every
policy parameter into the reference's (``ds_tensor``). Its parameters are never kept gathered between
forwards (``stage3_param_persistence_threshold`` 0), so a gathered copy cannot go stale after a sync.

First use JIT-compiles DeepSpeed's ops (30-75 s on 2 cores); ``TORCH_EXTENSIONS_DIR`` defaults to
``$ASTRAFLOW_CACHE/torch_extensions`` so that happens once per machine.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.core.errors import ConfigError, MissingDependencyError
from astraflow.core.rundir import cache_root
from astraflow.training.backends.base import TrainerBackend
from astraflow.training.checkpoint import DEEPSPEED, DEEPSPEED_TAG, TrainerState, is_deepspeed, read_state
from astraflow.training.distributed import SINGLE, Ranks, init_group, rank_device

if TYPE_CHECKING:
    import torch

INSTALL_HINT = "deepspeed is not installed: run `scripts/setup.sh deepspeed` (or `pip install astraflow[deepspeed]`)"
UNIVERSAL = "universal.tmp"
"""The scratch folder, next to the checkpoints, a checkpoint is converted into to be loaded."""


def _prepare_environment() -> None:
    """Where DeepSpeed compiles its ops, and its CPU accelerator where there is no GPU."""
    import torch

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root() / "torch_extensions"))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


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


class GatheredZeroState(Mapping):
    """The ``state_dict`` of a ZeRO-3 model whose parameters are gathered only when read, one at a time.

    Reading it (every rank, the same order) is a collective per parameter; each value is a copy, so
    the gathered parameter is freed again before the next one is read.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._state = model.state_dict()  # the partitioned parameters are empty here; the buffers are whole
        self._params = dict(model.named_parameters(remove_duplicate=False))

    def __getitem__(self, name: str) -> torch.Tensor:
        import deepspeed

        param = self._params.get(name)
        if param is None:
            return self._state[name]
        with deepspeed.zero.GatheredParameters([param]):
            return param.data.detach().clone()

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def bf16_mode(setting: str) -> bool:
    """Whether ``train.deepspeed.mixed_precision`` runs DeepSpeed's bf16 mode: ``bf16`` always, ``auto`` on a
    CUDA GPU with bf16."""
    import torch

    if setting == "bf16":
        return True
    return setting == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


class DeepSpeedBackend(TrainerBackend):
    """A ``deepspeed.initialize`` engine over ``model`` with an AdamW of the given settings, on ``ranks``."""

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        max_grad_norm: float,
        zero_stage: int = 2,
        offload_optimizer: bool = False,
        ranks: Ranks = SINGLE,
        mixed_precision: str = "auto",
    ) -> None:
        _prepare_environment()
        try:
            import deepspeed
        except ImportError as exc:
            raise MissingDependencyError(INSTALL_HINT) from exc
        import torch

        if offload_optimizer and zero_stage not in (1, 2):
            raise ValueError("optimizer offload needs ZeRO stage 1 or 2")
        init_group(ranks)  # DeepSpeed takes the group as it is
        model = model.to(rank_device(ranks))
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
        self.bf16 = bf16_mode(mixed_precision)
        if self.bf16:
            config["bf16"] = {"enabled": True}
        self.model = model
        self.ranks = ranks
        self.zero_stage = zero_stage
        with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints its whole config
            self.engine, engine_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.optimizer = _ZeroOptimizerState(engine_optimizer) if zero_stage > 0 else engine_optimizer
        self._param_groups = engine_optimizer.param_groups

    @property
    def module(self) -> torch.nn.Module:
        return self.engine

    def full_state(self) -> Mapping[str, torch.Tensor]:
        return GatheredZeroState(self.model) if self.zero_stage == 3 else self.model.state_dict()

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.zero_stage < 3:
            return super().frozen(model)
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "steps_per_print": 2**31 - 1,
        }
        if self.bf16:
            config["bf16"] = {"enabled": True}
        model = model.to(rank_device(self.ranks)).requires_grad_(False)
        with contextlib.redirect_stdout(io.StringIO()):
            engine, *_ = deepspeed.initialize(model=model, config=config)
        engine.eval()  # DeepSpeed's returns nothing
        return engine

    def sync_reference(self, reference: torch.nn.Module, alpha: float) -> None:
        if self.zero_stage < 3:
            return super().sync_reference(reference, alpha)
        import torch

        with torch.no_grad():
            for mine, policy in zip(reference.module.parameters(), self.model.parameters(), strict=True):
                if alpha == 1.0:
                    mine.ds_tensor.copy_(policy.ds_tensor)
                else:
                    mine.ds_tensor.mul_(1.0 - alpha).add_(policy.ds_tensor, alpha=alpha)

    @property
    def checkpoints_sharded(self) -> bool:
        return True

    def save_shards(self, tmp: Path) -> None:
        """This rank's partitions into ``tmp/deepspeed`` (DeepSpeed's format): every rank calls it."""
        self.engine.save_checkpoint(str(tmp / DEEPSPEED), tag=DEEPSPEED_TAG, save_latest=False)
        self._barrier()  # rank 0 commits the checkpoint once every rank has written its files

    def load_shards(self, directory: Path) -> TrainerState:
        """Load a DeepSpeed checkpoint of any world size through its universal form (module docstring)."""
        if not is_deepspeed(directory):
            raise ConfigError(
                f"{directory} was not written by the deepspeed backend: train.backend deepspeed resumes only "
                "from a checkpoint in DeepSpeed's format (or a single-rank model.pt); resume it with the "
                "backend that wrote it"
            )
        scratch = directory.parent / UNIVERSAL
        if self.ranks.leader:
            shutil.rmtree(scratch, ignore_errors=True)
            to_universal(directory / DEEPSPEED / DEEPSPEED_TAG, scratch / DEEPSPEED_TAG)
        self._barrier()
        config = self.engine._config
        config.load_universal_checkpoint = True
        try:
            loaded, _ = self.engine.load_checkpoint(
                str(scratch), tag=DEEPSPEED_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        finally:
            config.load_universal_checkpoint = False
        self._barrier()
        if self.ranks.leader:
            shutil.rmtree(scratch, ignore_errors=True)
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint converted from {directory}")
        return read_state(directory)

    def check_full_checkpoint(self, directory: Path) -> None:
        """Refuse a full checkpoint where this world's partitions cannot take it (several ranks, ZeRO-3)."""
        if self.ranks.distributed or self.zero_stage == 3:
            raise ConfigError(
                f"{directory} holds full state dicts of a single-rank deepspeed trainer (model.pt): it loads "
                "only into one rank at ZeRO stage 0-2; resume it that way once, and its next checkpoint, in "
                "DeepSpeed's format, resumes under any world size"
            )

    def _barrier(self) -> None:
        if self.ranks.distributed:
            import torch.distributed as dist

            dist.barrier()

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


def to_universal(source: Path, target: Path) -> None:
    """Convert the DeepSpeed checkpoint (tag folder) ``source`` into its universal form in ``target``."""
    import argparse

    from deepspeed.checkpoint.ds_to_universal import main

    args = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(target),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    with contextlib.redirect_stdout(io.StringIO()):  # it reports every step on stdout
        main(args)
