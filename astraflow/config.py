"""The run configuration: one YAML file, validated by pydantic at load time.

Every field has a docstring and bounds; an unknown field or an out-of-range value fails with a
``ConfigError`` whose message names the field path (``train.lr: ...``). The resolved config is
saved in the run directory by ``astraflow run`` so a run can be reproduced and replayed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from astraflow.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class LogConfig(_Section):
    backend: Literal["embedded", "kafka"] = "embedded"
    """Which log joins the components: a SQLite file in the run directory, or Apache Kafka."""
    bootstrap: str | None = None
    """Kafka bootstrap servers (``host:port``); required when ``backend`` is ``kafka``."""
    partitions: int = Field(default=2, ge=1, le=64)
    """Partitions of the tasks and trajectories topics (the most producers / processors that share work)."""

    @model_validator(mode="after")
    def _kafka_needs_bootstrap(self) -> "LogConfig":
        if self.backend == "kafka" and not self.bootstrap:
            raise ValueError("bootstrap is required when backend is 'kafka' (e.g. 127.0.0.1:9092)")
        return self


class ModelConfig(_Section):
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


class TaskConfig(_Section):
    kind: Literal["arithmetic"] = "arithmetic"
    """The task family; ``arithmetic`` is two-digit addition (``12+35=`` → ``47``), exact-match reward."""
    train_file: str | None = None
    """A jsonl dataset of ``{prompt_id, prompt, answer}`` rows to train on; unset: generated into the run directory."""
    heldout_file: str | None = None
    """A jsonl dataset of held-out rows for the evaluator; unset: generated into the run directory."""
    heldout_size: int = Field(default=200, ge=16, le=4000)
    """Held-out prompts kept out of training when the dataset is generated."""
    seed: int = 0
    """Seed of the generated split and of the feeder's prompt order."""


class WarmupConfig(_Section):
    target_accuracy: float = Field(default=0.30, gt=0.0, le=1.0)
    """Supervised warm-up stops once held-out greedy exact match reaches this."""
    max_steps: int = Field(default=3000, ge=1)
    """Upper bound on warm-up optimizer steps."""
    batch_size: int = Field(default=64, ge=1)
    """Warm-up batch size in examples."""
    lr: float = Field(default=3e-3, gt=0.0, le=1.0)
    """Warm-up AdamW learning rate."""
    eval_every: int = Field(default=25, ge=1)
    """Warm-up steps between held-out evaluations."""


class RolloutConfig(_Section):
    workflow: Literal["single_turn"] = "single_turn"
    """Episode logic run by the producers: ``single_turn`` samples one answer per prompt and scores it."""
    reward: Literal["exact_match"] = "exact_match"
    """Reward function of the workflow: ``exact_match`` is 1 for the reference answer, else 0."""
    producers: int = Field(default=1, ge=1, le=64)
    """Rollout producer processes started by ``astraflow run``."""
    group_size: int = Field(default=8, ge=1, le=1024)
    """Samples per prompt (G); one task asks for one group."""
    prompts_per_generation: int = Field(default=64, ge=1)
    """Tasks a producer takes from the log and samples in one batched generation."""
    max_new_tokens: int = Field(default=4, ge=1)
    """Longest response in tokens."""
    temperature: float = Field(default=1.0, gt=0.0, le=10.0)
    """Sampling temperature."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of each producer process."""


class StreamConfig(_Section):
    max_staleness: int = Field(default=2, ge=0)
    """Drop a sample when trainer version − its oldest token version exceeds this."""
    advantage: Literal["grpo"] = "grpo"
    """Advantage estimator of the group."""
    drop_zero_variance: bool = True
    """Dynamic sampling: drop groups whose rewards are all equal (they carry no gradient)."""


class TrainConfig(_Section):
    batch_samples: int = Field(default=256, ge=1)
    """Samples (responses) per optimizer step; groups are never split across steps."""
    lr: float = Field(default=2e-3, gt=0.0, le=1.0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    clip_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO clip ε below 1."""
    clip_high: float = Field(default=0.28, ge=0.0, le=10.0)
    """PPO clip ε above 1 (DAPO's clip-higher)."""
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradient clipping by global norm."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Versions between atomic checkpoints (model, optimizer, consumed offsets, version)."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the trainer process."""


class EvalConfig(_Section):
    every_versions: int = Field(default=1, ge=1)
    """Evaluate at most once per this many versions (the newest version wins when behind)."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the evaluator process."""


class StopConfig(_Section):
    max_minutes: float = Field(default=10.0, gt=0.0)
    """Wall-clock budget of ``astraflow run`` after warm-up."""
    target_accuracy: float | None = Field(default=None, gt=0.0, le=1.0)
    """Stop early once held-out accuracy reaches this (``None``: run for the whole budget)."""
    max_versions: int | None = Field(default=None, ge=1)
    """Stop once the trainer has published this many versions."""


class RunConfig(_Section):
    """One AstraFlow run: what every component of it reads."""

    run: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]+$")
    """Run name, the prefix of every topic (``{run}.{kind}.{name}``)."""
    policy: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the trained policy."""
    workflow: str = Field(default="math", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the rollout workflow."""
    log: LogConfig = LogConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    warmup: WarmupConfig = WarmupConfig()
    rollout: RolloutConfig = RolloutConfig()
    stream: StreamConfig = StreamConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    stop: StopConfig = StopConfig()


def load_config(path: str | Path, overrides: dict[str, object] | None = None) -> RunConfig:
    """Read and validate a YAML run config; ``overrides`` are dotted paths (``log.backend``)."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping, got {type(raw).__name__}")
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return parse_config(raw, source=str(path))


def parse_config(raw: dict, source: str = "config") -> RunConfig:
    """Validate a config mapping, turning pydantic errors into one ``ConfigError`` naming fields."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{source}: {problems}") from exc


def dump_config(config: RunConfig, path: Path) -> None:
    """Write the resolved config (every default filled in) as YAML."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
