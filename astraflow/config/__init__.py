"""The run configuration: one YAML file, validated by pydantic at load time.

Every field has a docstring and bounds; an unknown field or an out-of-range value fails with a
``ConfigError`` whose message names the field path (``train.lr: ...``). The resolved config is
saved in the run directory by ``astraflow run`` so a run can be reproduced and replayed.

One module per section of the YAML file, each a pydantic model built on ``base.Section``: ``log``,
``model`` (also ``task`` and ``warmup``), ``rollout`` (also ``engine`` and ``agent``), ``stream``
(with the feeder's curators; its operator specs in ``pipeline``), ``train``, ``evaluation``
(``eval``), ``weights``, ``stop``, ``scaler`` and ``policy`` (``policies``); ``run`` holds
``RunConfig``, which joins them, and the functions that load, validate and write it. This package
re-exports every public name, so ``from astraflow.config import X`` is the way to import them.
"""

from __future__ import annotations

from astraflow.config.evaluation import EvalConfig
from astraflow.config.log import KafkaSecurity, LogConfig
from astraflow.config.model import ModelConfig, TaskConfig, WarmupConfig
from astraflow.config.policy import PolicyConfig, PolicyRolloutConfig, Role
from astraflow.config.rollout import (
    AgentConfig,
    EngineConfig,
    OpenAIEngineOptions,
    RolloutConfig,
    SandboxConfig,
    SimulatedEngineOptions,
    VllmEngineOptions,
)
from astraflow.config.run import RunConfig, dump_config, load_config, parse_config, write_config_over
from astraflow.config.scaler import ScalerConfig
from astraflow.config.stop import StopConfig
from astraflow.config.stream import AcceptAllCurator, CuratorSpec, FilterSolvedCurator, GresoCurator, StreamConfig
from astraflow.config.train import (
    AdaptiveKlOptions,
    Aggregation,
    DeepSpeedOptions,
    FsdpOptions,
    KlConfig,
    KlEstimator,
    LossConfig,
    SimulatedTrainerOptions,
    TrainConfig,
)
from astraflow.config.weights import WeightsConfig

__all__ = [
    "AcceptAllCurator",
    "AdaptiveKlOptions",
    "AgentConfig",
    "Aggregation",
    "CuratorSpec",
    "DeepSpeedOptions",
    "EngineConfig",
    "EvalConfig",
    "FilterSolvedCurator",
    "FsdpOptions",
    "GresoCurator",
    "KafkaSecurity",
    "KlConfig",
    "KlEstimator",
    "LogConfig",
    "LossConfig",
    "ModelConfig",
    "OpenAIEngineOptions",
    "PolicyConfig",
    "PolicyRolloutConfig",
    "Role",
    "RolloutConfig",
    "RunConfig",
    "SandboxConfig",
    "ScalerConfig",
    "SimulatedEngineOptions",
    "SimulatedTrainerOptions",
    "StopConfig",
    "StreamConfig",
    "TaskConfig",
    "TrainConfig",
    "VllmEngineOptions",
    "WarmupConfig",
    "WeightsConfig",
    "dump_config",
    "load_config",
    "parse_config",
    "write_config_over",
]
