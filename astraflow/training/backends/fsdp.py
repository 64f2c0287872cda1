"""``train.backend: fsdp``: PyTorch FSDP2 (``fully_shard``): weights, gradients and AdamW states sharded.

Each decoder layer (the classes of the model's ``_no_split_modules``) is one FSDP unit, and the
root one holds the rest (embeddings, tied head, final norm): a forward gathers one layer's weights
at a time and frees them after it; the backward reduce-scatters each layer's gradients, averaged
over the ranks. Every rank keeps only its shard of the fp32 master weights and of the AdamW states.
``train.fsdp.mixed_precision: auto`` computes in bf16 with fp32 reductions on a GPU that has bf16,
and stays fp32 on the CPU, where the result equals a single-rank step within fp32 rounding.

FSDP2 always needs a process group: outside a launcher it forms a world of one (``init_group``).

Gathering for readers:

- ``full_state`` (what the trainer publishes): a mapping whose tensors are gathered one at a time
  (``DTensor.full_tensor``) as the publisher reads them, so no rank ever holds a second full copy of
  the model; rank 0 turns each into its transfer-dtype copy, the others drop it at once. Tensors
  tied to each other (embeddings and head) are gathered once and stay tied.
- ``model_state`` and ``optimizer`` (what checkpoints save): the full state dicts of
  ``torch.distributed.checkpoint.state_dict`` on rank 0's CPU (the others get empty ones), loaded back
  by every rank from the full dicts: one checkpoint format whatever the world size, so a run resumes
  under another one. The optimizer's is keyed by parameter name. Sharded (DCP) checkpoints, which
  never gather, are not done yet.

The KL term's reference model (``frozen``) is sharded as the policy is, with the same mixed precision,
and resharded after every forward (the root too, which FSDP2 otherwise keeps gathered for a backward
that a reference never runs): its no-grad forward gathers one layer at a time, and a sync copies each
rank's shards of the policy into its shards of the reference (``TrainerBackend.sync_reference``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping

import torch

from astraflow.training.backends.base import TrainerBackend
from astraflow.training.distributed import Ranks, init_group


def _full(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor of ``value``: gathered from every rank's shard (a collective) for a DTensor."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


class GatheredState(Mapping):
    """A model's ``state_dict`` whose sharded tensors are gathered only when read, one at a time.

    Reading it (every rank, the same order) is a collective per sharded tensor.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._state = model.state_dict()
        self._owner = {name: id(param) for name, param in model.named_parameters(remove_duplicate=False)}
        """Which parameter each name is: tied names share one (``state_dict`` detaches each name anew)."""

    def __getitem__(self, name: str) -> torch.Tensor:
        return _full(self._state[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:  # type: ignore[override]
        """(name, full tensor) in order; a tensor tied to another is gathered once and kept only until
        its last name is read."""
        tied: dict[object, torch.Tensor] = {}
        remaining = Counter(self._owner.get(name, name) for name in self._state)
        for name, value in self._state.items():
            key = self._owner.get(name, name)
            if remaining[key] > 1 or key in tied:
                if key not in tied:
                    tied[key] = _full(value)
                full = tied[key]
                remaining[key] -= 1
                if not remaining[key]:
                    del tied[key]
                yield name, full
            else:
                yield name, _full(value)


class _FullModelState:
    """``state_dict`` / ``load_state_dict`` of the full model (collectives: every rank calls them)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))


class _FullOptimizerState:
    """``state_dict`` / ``load_state_dict`` of the full AdamW state, keyed by parameter name (collectives)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.param_groups = optimizer.param_groups

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


def _units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules that become FSDP units of their own: the model's decoder layers."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def mixed_precision_dtype(setting: str) -> torch.dtype | None:
    """The compute dtype of ``train.fsdp.mixed_precision``: bf16 with ``auto`` on a GPU with bf16, else none."""
    if setting == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


class FsdpBackend(TrainerBackend):
    """AdamW over a model sharded by ``fully_shard`` across the default process group."""

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        max_grad_norm: float,
        ranks: Ranks,
        mixed_precision: str = "auto",
    ) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        init_group(ranks)
        compute = mixed_precision_dtype(mixed_precision)
        self.mp_policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32 if compute else None)
        for unit in _units(model):
            fully_shard(unit, mp_policy=self.mp_policy)
        fully_shard(model, mp_policy=self.mp_policy)
        self.model = model
        self.max_grad_norm = max_grad_norm
        self.mixed_precision = compute
        self._adamw = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
        self.optimizer = _FullOptimizerState(model, self._adamw)

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        model = model.to(next(self.model.parameters()).device).requires_grad_(False).eval()
        for unit in _units(model):
            fully_shard(unit, mp_policy=self.mp_policy, reshard_after_forward=True)
        fully_shard(model, mp_policy=self.mp_policy, reshard_after_forward=True)
        return model

    @property
    def model_state(self) -> _FullModelState:
        return _FullModelState(self.model)

    def full_state(self) -> Mapping[str, torch.Tensor]:
        return GatheredState(self.model)

    def sharded_parts(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        return self.model, self._adamw

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def zero_grad(self) -> None:
        self._adamw.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self, lr: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        norm = float(_full(norm))  # a DTensor norm is partial per rank until gathered
        if not torch.isfinite(torch.tensor(norm)):
            self.zero_grad()
            return norm
        for group in self._adamw.param_groups:
            group["lr"] = lr
        self._adamw.step()
        return norm
