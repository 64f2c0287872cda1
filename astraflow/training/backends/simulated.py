"""``train.backend: simulated``: a trainer that takes the time of a step without computing it.

For capacity planning (docs/simulated_cluster.md): the real trainer process runs, with its
batches, checkpoints, weight publishing and metrics, but each optimizer step is replaced by a
sleep of what the step would take on the cluster the config stands for
(``TrainTimeModel``: a fixed part plus per-sample and per-token work, shared by ``devices``
data-parallel GPUs with ideal scaling) times ``time_scale``. The weights stay the base
checkpoint's, so every version publishes an empty delta and the weight path still runs end to
end. Sleeping keeps the CPU free: a simulated cluster of many processes runs on a laptop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from astraflow.config import KlConfig
from astraflow.training.backends.base import TrainerBackend
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer, StepStats, lr_factor

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from astraflow.config import SimulatedTrainerOptions


@dataclass(frozen=True)
class TrainTimeModel:
    """Seconds of one optimizer step on ``devices`` GPUs (data parallel, ideal scaling)."""

    step_seconds: float
    sample_seconds: float
    token_seconds: float
    devices: int

    @classmethod
    def from_options(cls, options: SimulatedTrainerOptions) -> TrainTimeModel:
        """The model of ``train.simulated``."""
        return cls(options.step_seconds, options.sample_seconds, options.token_seconds, options.devices)

    def seconds(self, tokens: Sequence[int]) -> float:
        """A step on samples of these token counts (prompt + response each)."""
        work = len(tokens) * self.sample_seconds + float(np.sum(tokens, dtype=np.float64)) * self.token_seconds
        return self.step_seconds + work / self.devices


class SimulatedLearner(PolicyTrainer):
    """``PolicyTrainer``'s contract (``version``, ``model``, ``optimizer``, ``step``) with a slept step; it
    computes no loss, so ``train.kl`` builds no reference and adds nothing."""

    def __init__(
        self, model: PreTrainedModel, pad_id: int, config: PolicyStepConfig, backend: SimulatedBackend
    ) -> None:
        super().__init__(model, pad_id, replace(config, kl=KlConfig()), backend=backend)
        self.time_model = backend.time_model
        self.sleep = backend.sleep
        self.simulated_seconds = 0.0
        """Simulated seconds of every step so far."""

    def step(self, examples: Sequence[PolicyExample]) -> StepStats:
        if not examples:
            raise ValueError("PolicyTrainer.step needs at least one example")
        started = time.perf_counter()
        tokens = [example.length for example in examples]
        seconds = self.time_model.seconds(tokens)
        self.sleep(seconds)
        self.simulated_seconds += seconds
        config = self.config
        lr = config.lr * lr_factor(self.version, config.lr_warmup_steps, config.lr_decay_steps, config.min_lr_ratio)
        self.version += 1
        trained = int(sum(int(np.sum(example.loss_mask)) for example in examples))
        return StepStats(
            self.version,
            0.0,
            0.0,
            lr,
            len(examples),
            trained,
            time.perf_counter() - started,
            {"simulated_seconds": seconds},
        )


class SimulatedBackend(TrainerBackend):
    """No optimizer work: its learner (``build_learner``) is a ``SimulatedLearner`` that sleeps
    each step's modelled time.

    ``sleep(simulated_seconds)`` defaults to ``time.sleep`` scaled by ``time_scale``; tests pass
    their own so they never wait on the wall clock.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        time_model: TrainTimeModel,
        time_scale: float = 1.0,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        import torch

        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters())  # never stepped: the checkpoint keeps its (empty) state
        self.time_model = time_model
        self.sleep = sleep or (lambda seconds: time.sleep(seconds * time_scale))

    def zero_grad(self) -> None:
        """Nothing to forget: no gradients are computed."""

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Nothing to accumulate: ``SimulatedLearner`` computes no loss."""

    def step(self, lr: float) -> float:
        """No update (the weights stay the base's); the gradient norm is 0."""
        return 0.0
