"""The ``model``, ``task`` and ``warmup`` sections: the base model, the task family and the supervised warm-up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from astraflow.config.base import Section


class ModelConfig(Section):
    path: str | None = None
    """A local Hugging Face checkpoint directory; when unset a tiny model is built and warmed up."""
    layers: int = Field(default=4, ge=1, le=64)
    """Tiny model: transformer layers."""
    hidden: int = Field(default=128, ge=16, le=4096)
    """Tiny model: hidden size."""
    heads: int = Field(default=4, ge=1, le=64)
    """Tiny model: attention heads (must divide ``hidden``)."""
    seed: int = 0
    """Seed for the tiny model's initialisation."""

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ModelConfig":
        if self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden})")
        return self


class TaskConfig(Section):
    kind: Literal["arithmetic", "search_facts", "code_io", "rooms"] = "arithmetic"
    (
        "The task family: ``arithmetic`` (``12+35=`` → ``47``); ``search_facts`` (made-up entity facts, answerable by "
        "searching a generated corpus); ``code_io`` (programs from input/output examples); ``rooms`` (text "
        "room-navigation games)."
    )
    train_file: str | None = None
    """A jsonl dataset of ``{prompt_id, prompt, answer}`` rows to train on; unset: generated into the run directory."""
    heldout_file: str | None = None
    """A jsonl dataset of held-out rows for the evaluator; unset: generated into the run directory."""
    heldout_size: int = Field(default=200, ge=16, le=4000)
    """Held-out prompts kept out of training when the dataset is generated."""
    seed: int = 0
    """Seed of the generated split and of the feeder's prompt order."""


class WarmupConfig(Section):
    target_accuracy: float = Field(default=0.30, gt=0.0, le=1.0)
    """Supervised warm-up stops once held-out greedy exact match reaches this (to the step: ``max_overshoot``)."""
    max_steps: int = Field(default=3000, ge=1)
    """Upper bound on warm-up optimizer steps."""
    batch_size: int = Field(default=64, ge=1)
    """Warm-up batch size in examples."""
    lr: float = Field(default=1e-3, gt=0.0, le=1.0)
    """Warm-up AdamW learning rate."""
    eval_every: int = Field(default=25, ge=1)
    """Warm-up steps between held-out evaluations."""
    max_overshoot: float | None = Field(default=0.05, ge=0.0)
    """How far past ``target_accuracy`` an evaluation may land and still end the warm-up. One further
    above crossed the target somewhere in the ``eval_every`` steps before it (the score climbs fast
    there: the math example went 0.195 → 0.38 in 25 steps, and to 0.535 on another CPU): the model,
    optimizer and batch order go back to the previous evaluation's state, the same batches are
    replayed with an evaluation after every step, and the warm-up stops at the first step that
    reaches the target. Unset: stop at the first evaluation at or above the target, wherever it lands."""
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Tokens (rows x longest row, about what is padded) of one warm-up forward: each sampled batch is ordered by
    length and cut into micro-batches of at most this many, each padded to its own longest row; the
    gradient is the whole batch's. Unset: the batch is padded as one. Where rows differ widely in
    length, one padded batch is mostly padding (the rooms example's demonstrations run ~100-550
    tokens: a step of 32 in 0.69 s at 2048 against 1.52 s whole); where they do not (code, ~55 each)
    it saves nothing. The float order changes, and so does the base it builds."""
