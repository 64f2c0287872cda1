"""``RunConfig``, the whole run configuration, and reading, validating and writing it as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from astraflow.config.base import Section
from astraflow.config.evaluation import EvalConfig
from astraflow.config.log import LogConfig
from astraflow.config.model import ModelConfig, TaskConfig, WarmupConfig
from astraflow.config.policy import PolicyConfig, PolicyRolloutConfig, Role
from astraflow.config.rollout import AgentConfig, EngineConfig, RolloutConfig
from astraflow.config.scaler import ScalerConfig
from astraflow.config.stop import StopConfig
from astraflow.config.stream import StreamConfig
from astraflow.config.train import TrainConfig
from astraflow.config.weights import WeightsConfig
from astraflow.core.errors import ConfigError


def _merged(base: BaseModel, override: BaseModel | None, where: str) -> BaseModel:
    """``base`` with the fields written in ``override`` (re-validated, so cross-field checks see the result)."""
    if override is None:
        return base
    data = {name: getattr(base, name) for name in base.model_fields_set}
    for name in override.model_fields_set:
        value, inherited = getattr(override, name), getattr(base, name)
        nested = isinstance(value, BaseModel) and type(value) is type(inherited)
        data[name] = _merged(inherited, value, f"{where}.{name}") if nested else value
    try:
        return type(base).model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{where}: {exc.errors()[0]['msg']}") from exc


class RunConfig(Section):
    """One AstraFlow run: what every component of it reads.

    With ``policies`` the run trains several policies at once: each gets its own base checkpoint,
    topics, stream processor, trainer and evaluator, configured by ``for_policy(name)``.
    """

    run: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]+$")
    """Run name, the prefix of every topic (``{run}.{kind}.{name}``)."""
    policy: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the trained policy (with ``policies``: the policy this config was narrowed to by ``for_policy``)."""
    role: Role = "answer"
    (
        "What the policy produces: ``answer`` (the task's answer) or ``judge`` (a verdict on claims "
        "``<prompt><candidate>?``, given by writing its own answer). Picks its warm-up data and held-out evaluation."
    )
    mode: Literal["async", "lockstep"] = "async"
    (
        "``async``: rollout runs ahead of training within each policy's ``stream.max_staleness``; ``lockstep``: "
        "on-policy, max_staleness 0 everywhere, and the feeder releases the next batch only once every trainer "
        "published the version trained on the previous one."
    )
    policies: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")], PolicyConfig] | None = None
    (
        "Several policies trained together: name → overrides of ``role``, ``model``, ``warmup``, ``train``, "
        "``stream``, ``engine`` and ``rollout`` (group_size, max_new_tokens, temperature), merged field by field; "
        "unset: the single ``policy``."
    )
    workflow: str = Field(default="math", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the rollout workflow."""
    log: LogConfig = LogConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    warmup: WarmupConfig = WarmupConfig()
    rollout: RolloutConfig = RolloutConfig()
    engine: EngineConfig = EngineConfig()
    agent: AgentConfig = AgentConfig()
    stream: StreamConfig = StreamConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    weights: WeightsConfig = WeightsConfig()
    stop: StopConfig = StopConfig()
    scaler: ScalerConfig = ScalerConfig()

    @model_validator(mode="before")
    @classmethod
    def _lockstep_is_on_policy(cls, raw: object) -> object:
        """In ``mode: lockstep`` an unset ``stream.max_staleness`` is 0, so the saved config loads again."""
        if isinstance(raw, dict) and raw.get("mode") == "lockstep" and isinstance(raw.get("stream", {}), dict):
            raw = {**raw, "stream": {"max_staleness": 0, **raw.get("stream", {})}}
        return raw

    @model_validator(mode="after")
    def _policies_are_runnable(self) -> "RunConfig":
        if self.policies is not None and not self.policies:
            raise ValueError("policies: declare at least one policy, or leave it out for the single `policy`")
        for name in self.policy_names():
            override = (self.policies or {}).get(name)
            stream, where = (
                (override.stream, f"policies.{name}.stream")
                if override and override.stream
                else (self.stream, "stream")
            )
            if self.mode == "lockstep" and "max_staleness" in stream.model_fields_set and stream.max_staleness:
                raise ValueError(f"{where}.max_staleness: must be 0 (or unset) in mode 'lockstep'")
            self.for_policy(name)
        for name in self.policy_names():
            narrowed = self.for_policy(name)
            engine, train = narrowed.engine, narrowed.train
            if (
                engine.type == train.backend == "simulated"
                and engine.simulated.time_scale != train.simulated.time_scale
            ):
                raise ValueError(
                    f"engine.simulated.time_scale ({engine.simulated.time_scale}) and "
                    f"train.simulated.time_scale ({train.simulated.time_scale}) of policy {name!r} "
                    f"must be equal, or the simulated cluster runs at two speeds"
                )
        if self.rollout.workflow == "solver_verifier":
            roles = sorted(self.for_policy(name).role for name in self.policy_names())
            if roles != ["answer", "judge"]:
                raise ValueError(
                    f"policies: workflow 'solver_verifier' needs one policy with role 'answer' and one "
                    f"with role 'judge', got roles {roles}"
                )
        return self

    @model_validator(mode="after")
    def _engines_take_new_weights(self) -> "RunConfig":
        """A run trains every policy: an engine that cannot load new versions would sample the first one for ever,
        and the run stall once the staleness bound drops every trajectory."""
        for name in self.policy_names():
            engine = self.for_policy(name).engine
            if engine.type == "openai" and engine.openai.weight_update == "none":
                raise ValueError(
                    f"engine.openai.weight_update: 'none' (policy {name!r}) serves fixed weights, but the run trains "
                    "the policy, so its rollout producers would never take a new version; set weight_update: "
                    "sglang_disk with an update_dir the server reads, or engine.type: torch or vllm"
                )
        return self

    @model_validator(mode="after")
    def _stream_runtime_fits_the_log(self) -> "RunConfig":
        for name in self.policy_names():
            narrowed = self.for_policy(name)
            if self.log.backend == "embedded" and narrowed.stream.runtime == "faust":
                raise ValueError(
                    "stream.runtime: 'faust' runs on Kafka only (log.backend: kafka); use 'native' on the embedded log"
                )
            instances = narrowed.stream.instances
            if instances > 1 and narrowed.stream_runtime() != "native":
                raise ValueError(
                    f"stream.instances: {instances} (policy {name!r}) needs stream.runtime: native; the faust runtime "
                    "keeps its operators' state in memory, so a partition moved to another worker would lose it"
                )
            if instances > self.log.partitions:
                raise ValueError(
                    f"stream.instances: {instances} (policy {name!r}) exceeds log.partitions: {self.log.partitions}; "
                    "an instance without a trajectories partition would have no work"
                )
        return self

    def stream_runtime(self) -> str:
        """The stream runtime this (narrowed) config runs: ``stream.runtime``, else faust on Kafka,
        native on the embedded log."""
        return self.stream.runtime or ("faust" if self.log.backend == "kafka" else "native")

    def policy_names(self) -> tuple[str, ...]:
        """The trained policies, in declaration order."""
        return tuple(self.policies) if self.policies else (self.policy,)

    def for_policy(self, name: str) -> "RunConfig":
        """The config as one policy's components read it: ``policy`` = ``name`` and its sections merged."""
        if name not in self.policy_names():
            raise ConfigError(f"policy: {name!r} is not one of the run's policies {list(self.policy_names())}")
        override = (self.policies or {}).get(name) or PolicyConfig()
        where = f"policies.{name}"
        stream = _merged(self.stream, override.stream, f"{where}.stream")
        if self.mode == "lockstep":
            stream = stream.model_copy(update={"max_staleness": 0})
        rollout_override = override.rollout or PolicyRolloutConfig()
        rollout = self.rollout.model_copy(
            update={k: v for k in rollout_override.model_fields_set if (v := getattr(rollout_override, k)) is not None}
        )
        return self.model_copy(
            update={
                "policy": name,
                "role": override.role or self.role,
                "model": _merged(self.model, override.model, f"{where}.model"),
                "warmup": _merged(self.warmup, override.warmup, f"{where}.warmup"),
                "train": _merged(self.train, override.train, f"{where}.train"),
                "stream": stream,
                "rollout": rollout,
                "engine": _merged(self.engine, override.engine, f"{where}.engine"),
            }
        )


def write_config_over(base: Path, path: Path, **sections: object) -> Path:
    """The YAML config ``base`` with ``sections`` merged over it, written to ``path``: a dict updates
    that section key by key, anything else replaces it (how tests and benchmarks vary an example)."""
    raw = yaml.safe_load(Path(base).read_text())
    for name, values in sections.items():
        if isinstance(values, dict):
            raw.setdefault(name, {}).update(values)
        else:
            raw[name] = values
    path.write_text(yaml.safe_dump(raw))
    return path


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
