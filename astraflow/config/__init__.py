"""The run configuration: one YAML file, validated by pydantic at load time.

Every field has a docstring and bounds; an unknown field or an out-of-range value fails with a
``ConfigError`` whose message names the field path (``train.lr: ...``). The resolved config is
saved in the run directory by ``astraflow run`` so a run can be reproduced and replayed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from astraflow.errors import ConfigError
from astraflow.config.pipeline import (
    ADVANTAGE_SPECS,
    OperatorSpec,
    ReplaySpec,
    StalenessSpec,
    ZeroVarianceSpec,
    check_pipeline,
)


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
    kind: Literal["arithmetic", "search_facts", "code_io", "rooms"] = "arithmetic"
    """The task family: ``arithmetic`` (``12+35=`` → ``47``); ``search_facts`` (made-up entity facts, answerable by searching a generated corpus); ``code_io`` (programs from input/output examples); ``rooms`` (text room-navigation games)."""
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
    lr: float = Field(default=1e-3, gt=0.0, le=1.0)
    """Warm-up AdamW learning rate."""
    eval_every: int = Field(default=25, ge=1)
    """Warm-up steps between held-out evaluations."""


class RolloutConfig(_Section):
    workflow: Literal["single_turn", "search", "code", "rooms", "http_env", "solver_verifier"] = "single_turn"
    """Episode logic run by the producers: ``single_turn`` samples one answer per prompt and scores it; the multi-turn ones (limits in ``agent``) are ``search`` (BM25 search tool), ``code`` (programs run in the sandbox), ``rooms`` (the bundled room-navigation game) and ``http_env`` (an environment served at ``agent.env_url``); ``solver_verifier`` involves two ``policies``: one with ``role: answer`` answers, one with ``role: judge`` judges each answer."""
    reward: Literal["exact_match", "tests_passed", "env"] = "exact_match"
    """Reward of the workflow: ``exact_match`` (1 for the reference answer; ``single_turn``, ``search``), ``tests_passed`` (fraction of tests passed; ``code``), ``env`` (what the environment reports; ``rooms``, ``http_env``)."""
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
    system_samples: int = Field(default=4, ge=1, le=64)
    """Multi-policy workflows: answers the evaluator samples per held-out prompt for the system accuracy (the judge keeps the first it accepts)."""


class VllmEngineOptions(_Section):
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=1.0)
    """``vllm``: fraction of the GPU's memory vLLM may take (weights + KV cache)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """``vllm``: longest prompt + response in tokens; unset: the model's own limit."""


class OpenAIEngineOptions(_Section):
    base_url: str | None = None
    """``openai``: the server's API root, e.g. ``http://127.0.0.1:8000/v1``; required for ``openai``."""
    model: str | None = None
    """``openai``: the served model name; unset: the first one ``/models`` lists."""
    timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0)
    """``openai``: timeout of one request."""
    max_parallel: int = Field(default=16, ge=1, le=1024)
    """``openai``: requests in flight at once (one per prompt; the ``n`` samples share it)."""
    weight_update: Literal["none", "sglang_disk"] = "none"
    """``openai``: how new versions reach the server: ``none`` (it serves fixed weights and the engine says so) or ``sglang_disk`` (safetensors written to ``update_dir``, loaded by SGLang's ``/update_weights_from_disk``)."""
    update_dir: str | None = None
    """``openai`` with ``sglang_disk``: a directory the producer writes and the server reads at the same path."""

    @model_validator(mode="after")
    def _disk_update_needs_dir(self) -> "OpenAIEngineOptions":
        if self.weight_update == "sglang_disk" and not self.update_dir:
            raise ValueError("update_dir is required when weight_update is 'sglang_disk'")
        return self


class SimulatedEngineOptions(_Section):
    """``simulated``: the time model of one GPU inference replica, for capacity planning (docs/simulated_cluster.md).

    Defaults stand for an 8B model served by vLLM on one H100 (order of magnitude, not a measurement).
    """

    decode_step_seconds: float = Field(default=0.015, ge=0.0, le=60.0)
    """Seconds of one decode step (one token for every running sequence) with a single sequence running: reading the weights."""
    seq_step_seconds: float = Field(default=0.00008, ge=0.0, le=60.0)
    """Seconds each further running sequence adds to a decode step (reading its KV cache)."""
    max_concurrency: int = Field(default=256, ge=1, le=65536)
    """Sequences decoded at once (vLLM's ``max_num_seqs``); the others of a call wait for a free slot."""
    median_tokens: int = Field(default=600, ge=1, le=10_000_000)
    """Median response length in tokens (lognormal, cut at ``rollout.max_new_tokens``)."""
    p99_over_p50: float = Field(default=8.0, ge=1.0, le=1000.0)
    """Tail of the response lengths: p99 over the median (8: reasoning-model-like; 1: every response is ``median_tokens`` long)."""
    accuracy: float = Field(default=0.5, ge=0.0, le=1.0)
    """Chance that a response to an arithmetic prompt (``12+35=``, or ``12+35=47?`` for a judge) starts with the right answer; other prompts get filler, scored 0."""
    load_seconds: float = Field(default=2.0, ge=0.0, le=3600.0)
    """Seconds to apply a new weight version between two generations."""
    time_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Wall seconds slept per simulated second (0.1: a 77 s iteration takes 7.7 s); must equal ``train.simulated.time_scale`` when both are simulated."""


class EngineConfig(_Section):
    """What rollout producers generate with (``astraflow.engines``)."""

    type: Literal["torch", "vllm", "openai", "simulated"] = "torch"
    """``torch``: transformers + our sampler, CPU or GPU; ``vllm``: vLLM in the producer process (GPU); ``openai``: any OpenAI-compatible server that returns token ids and log-probs; ``simulated``: no model, token ids and log-probs of the right shapes after the time of ``simulated`` (capacity planning)."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """``torch``: where the model runs; ``auto``: a CUDA GPU when one is visible."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """``torch`` / ``vllm``: weight dtype; ``auto``: bfloat16 on GPUs that support it, else float16 on GPU, float32 on CPU."""
    chat_template: bool = False
    """Encode each prompt as one user turn of the tokenizer's chat template, when the tokenizer has one."""
    vllm: VllmEngineOptions = VllmEngineOptions()
    openai: OpenAIEngineOptions = OpenAIEngineOptions()
    simulated: SimulatedEngineOptions = SimulatedEngineOptions()

    @model_validator(mode="after")
    def _openai_needs_url(self) -> "EngineConfig":
        if self.type == "openai" and not self.openai.base_url:
            raise ValueError("openai.base_url is required when type is 'openai' (e.g. http://127.0.0.1:8000/v1)")
        return self

class SandboxConfig(_Section):
    backend: Literal["auto", "bwrap", "unshare"] = "auto"
    """Isolation of model-generated programs: ``bwrap`` (bubblewrap), ``unshare`` (user namespaces + rlimits), ``auto`` (the first that works); none working is an error at start-up."""
    python: str = "/usr/bin/python3"
    """Interpreter inside the sandbox (the host's system Python, seen read-only)."""
    wall_seconds: float = Field(default=2.0, gt=0.0, le=600.0)
    """Wall-clock limit of one program run (one test of the code task); the run is killed after it."""
    cpu_seconds: int = Field(default=1, ge=1, le=600)
    """CPU-time limit of each process (RLIMIT_CPU)."""
    memory_mb: int = Field(default=256, ge=32, le=65536)
    """Address-space limit of each process in MiB (RLIMIT_AS)."""
    max_processes: int = Field(default=16, ge=2, le=4096)
    """Processes and threads the program may run at once (RLIMIT_NPROC in its own user namespace)."""
    max_file_mb: int = Field(default=8, ge=1, le=4096)
    """Largest file, and size of the tmpfs ``/work`` and ``/tmp``, in MiB."""


class AgentConfig(_Section):
    """Limits and tools of the multi-turn workflows (``rollout.workflow`` other than ``single_turn``)."""

    max_turns: int = Field(default=4, ge=1, le=256)
    """Policy turns per episode (each answered by the environment)."""
    max_total_tokens: int = Field(default=256, ge=2, le=1_000_000)
    """Response tokens per episode, policy and environment turns together (``rollout.max_new_tokens`` bounds one policy turn)."""
    max_observation_tokens: int = Field(default=64, ge=1, le=100_000)
    """Tokens kept of one environment turn (the rest is cut)."""
    max_tool_seconds: float = Field(default=30.0, gt=0.0, le=3600.0)
    """Environment / tool time per episode; past it the episode ends (``tool_time_limit``)."""
    tool_workers: int = Field(default=4, ge=1, le=256)
    """Environment steps a producer runs in parallel."""
    search_top_k: int = Field(default=1, ge=1, le=50)
    """``search``: documents returned per query."""
    corpus_file: str | None = None
    """``search``: jsonl corpus of ``{doc_id, text}`` rows; unset: the one generated with the task in the run directory."""
    env_url: str | None = None
    """``http_env``: base URL of the environment server (``reset`` / ``step`` / ``close``)."""
    env_timeout_s: float = Field(default=10.0, gt=0.0, le=600.0)
    """``http_env``: timeout of one request."""
    sandbox: SandboxConfig = SandboxConfig()


class AcceptAllCurator(_Section):
    type: Literal["accept_all"] = "accept_all"
    """Submit every prompt."""


class FilterSolvedCurator(_Section):
    type: Literal["filter_solved"] = "filter_solved"
    """Stop submitting prompts whose EWMA pass rate exceeds a threshold."""
    threshold: float = Field(default=0.95, gt=0.0, le=1.0)
    """Stop submitting a prompt once the EWMA of its pass rate exceeds this."""
    alpha: float = Field(default=0.5, gt=0.0, le=1.0)
    """EWMA weight of a prompt's newest group (1: only the last group counts)."""
    min_groups: int = Field(default=1, ge=1)
    """Groups of a prompt observed before it may be filtered."""


class GresoCurator(_Section):
    type: Literal["greso"] = "greso"
    """GRESO: skip prompts after zero-variance streaks with probability 1 − p^streak."""
    p_easy: float = Field(default=0.5, gt=0.0, le=1.0)
    """Initial submit probability base after all-correct groups (submit with p_easy^streak)."""
    p_hard: float = Field(default=0.5, gt=0.0, le=1.0)
    """Initial submit probability base after all-wrong groups (submit with p_hard^streak)."""
    target_easy: float = Field(default=0.083, ge=0.0, le=1.0)
    """Target share of groups that are all correct; p_easy falls while the share is at or above it."""
    target_hard: float = Field(default=0.167, ge=0.0, le=1.0)
    """Target share of groups that are all wrong; p_hard falls while the share is at or above it."""
    step: float = Field(default=0.01, gt=0.0, le=0.5)
    """Change of p_easy / p_hard after each adaptation window."""
    p_min: float = Field(default=0.05, gt=0.0, le=1.0)
    """Lower bound of p_easy and p_hard."""
    p_max: float = Field(default=0.95, gt=0.0, le=1.0)
    """Upper bound of p_easy and p_hard."""
    adapt_every: int = Field(default=64, ge=1)
    """Groups of feedback per adaptation window (GRESO adapts once per training batch)."""
    seed: int = 0
    """Seed of the submit draws."""

    @model_validator(mode="after")
    def _bounds(self) -> "GresoCurator":
        if not self.p_min <= min(self.p_easy, self.p_hard) <= max(self.p_easy, self.p_hard) <= self.p_max:
            raise ValueError(f"need p_min ({self.p_min}) <= p_easy, p_hard <= p_max ({self.p_max})")
        return self


CuratorSpec = Annotated[Union[AcceptAllCurator, FilterSolvedCurator, GresoCurator], Field(discriminator="type")]


class StreamConfig(_Section):
    """The stream processor's pipeline and the feeder's curator.

    ``pipeline`` lists the operators (``{op: name, ...params}``, see ``astraflow.config.pipeline``).
    Without it, ``advantage`` and ``drop_zero_variance`` give the default pipeline
    ``staleness → <advantage> → zero_variance``; with it, they must be left unset.
    """

    max_staleness: int = Field(default=2, ge=0)
    """Drop a sample when trainer version − its oldest token version exceeds this (also the feeder's budget)."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = "grpo"
    """Advantage estimator of the default pipeline (when ``pipeline`` is unset)."""
    drop_zero_variance: bool = True
    """Default pipeline: drop groups whose rewards are all equal (they carry no gradient)."""
    pipeline: list[OperatorSpec] | None = None
    """Operators in dataflow order: group operators, then mixers, then at most one ordering."""
    curator: CuratorSpec = AcceptAllCurator()
    """Which prompts the task feeder submits, from the PromptStats on the feedback topic."""
    runtime: Literal["native", "faust"] | None = None
    """What runs the pipeline: ``native`` (any log) or ``faust`` (Kafka only: faust agents, half-filled groups in a changelog-backed table, exactly-once through Kafka transactions); unset: faust on Kafka, native on the embedded log."""

    @model_validator(mode="after")
    def _pipeline_is_runnable(self) -> "StreamConfig":
        if self.pipeline is None:
            return self
        legacy = sorted({"advantage", "drop_zero_variance"} & self.model_fields_set)
        if legacy:
            raise ValueError(f"{', '.join(legacy)}: only for the default pipeline; write it into stream.pipeline")
        try:
            check_pipeline(self.pipeline)
        except ValueError as exc:
            raise ValueError(f"pipeline: {exc}") from exc
        return self

    @model_serializer(mode="wrap")
    def _omit_legacy(self, handler: SerializerFunctionWrapHandler) -> dict:
        """With a pipeline, the saved config leaves out the default pipeline's fields, so it loads again."""
        data = handler(self)
        if self.pipeline is not None:
            data.pop("advantage", None)
            data.pop("drop_zero_variance", None)
        return data

    def operators(self) -> list[OperatorSpec]:
        """The pipeline as written, or the default one built from the legacy fields."""
        if self.pipeline is not None:
            return list(self.pipeline)
        default: list[OperatorSpec] = [StalenessSpec(), ADVANTAGE_SPECS[self.advantage]()]
        return default + [ZeroVarianceSpec()] if self.drop_zero_variance else default

    @property
    def replay_ratio(self) -> float:
        """Fraction of emitted samples that are replayed (0 without a ``replay`` operator)."""
        return next((spec.ratio for spec in self.operators() if isinstance(spec, ReplaySpec)), 0.0)


class DeepSpeedOptions(_Section):
    zero_stage: int = Field(default=2, ge=0, le=2)
    """ZeRO stage: 0 (plain data parallel), 1 (optimizer states sharded), 2 (and gradients)."""
    offload_optimizer: bool = False
    """Keep the optimizer states on the CPU and step them there (DeepSpeedCPUAdam, compiled on first use)."""

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> "DeepSpeedOptions":
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1 or 2")
        return self


class SimulatedTrainerOptions(_Section):
    """``simulated``: the time model of one trainer, for capacity planning (docs/simulated_cluster.md).

    A step takes ``step_seconds + Σ (sample_seconds + tokens · token_seconds) / devices`` over its
    samples (prompt and response tokens), slept at ``time_scale``; the weights stay the base's and are
    published as usual. Defaults stand for an 8B model on H100s (order of magnitude, not a measurement).
    """

    devices: int = Field(default=2, ge=1, le=65536)
    """GPUs the trainer stands for (data parallel, ideal scaling)."""
    sample_seconds: float = Field(default=0.0, ge=0.0, le=3600.0)
    """Seconds of one sample on one device, whatever its length."""
    token_seconds: float = Field(default=0.00016, ge=0.0, le=60.0)
    """Seconds of one token on one device: forward and backward, and the forward that scores the old log-probs."""
    step_seconds: float = Field(default=1.0, ge=0.0, le=3600.0)
    """Seconds of each step whatever its size: optimizer update, gradient all-reduce."""
    time_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Wall seconds slept per simulated second; must equal ``engine.simulated.time_scale`` when both are simulated."""


class TrainConfig(_Section):
    batch_samples: int = Field(default=256, ge=1)
    """Samples (responses) per optimizer step; groups are never split across steps."""
    lr: float = Field(default=3e-4, gt=0.0, le=1.0)
    """Peak AdamW learning rate."""
    lr_warmup_versions: int = Field(default=30, ge=0)
    """Linear learning-rate warm-up over this many versions (optimizer steps)."""
    lr_decay_versions: int = Field(default=300, ge=0)
    """Cosine decay to ``min_lr_ratio * lr`` over this many versions after warm-up; 0 keeps it constant."""
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    """Floor of the cosine decay, as a fraction of ``lr``."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    clip_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO clip ε below 1."""
    clip_high: float = Field(default=0.2, ge=0.0, le=10.0)
    """PPO clip ε above 1 (raise it for DAPO's clip-higher, e.g. 0.28)."""
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradient clipping by global norm."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Versions between atomic checkpoints (model, optimizer, consumed offsets, version)."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the trainer process."""
    backend: Literal["torch", "deepspeed", "simulated"] = "torch"
    """Optimizer backend: ``torch`` (AdamW in this process), ``deepspeed`` (ZeRO, ``train.deepspeed``; on CPU with gloo) or ``simulated`` (no compute: each step takes the time of ``train.simulated``; capacity planning)."""
    deepspeed: DeepSpeedOptions = DeepSpeedOptions()
    simulated: SimulatedTrainerOptions = SimulatedTrainerOptions()


class EvalConfig(_Section):
    enabled: bool = True
    """Start the evaluators (each policy's, and the system evaluator) with ``astraflow run``; off for a simulated cluster, which has no model to score."""
    every_versions: int = Field(default=1, ge=1)
    """Evaluate at most once per this many versions (the newest version wins when behind)."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the evaluator process."""


class WeightsConfig(_Section):
    transfer_dtype: Literal["bf16", "fp32"] = "bf16"
    """Element type of floating-point weights on the weights topic; every reader loads exactly these values."""
    encoding: Literal["delta", "full"] = "delta"
    """``delta``: sparse deltas of the changed elements against the previous version; ``full``: every version whole."""
    full_sync_interval: int = Field(default=10, ge=1)
    """With ``delta``: publish a full version at least every this many versions (and the first one), so readers that missed a delta resync."""
    chunk_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=32 * 1024 * 1024)
    """Payload bytes per chunk (record or stored file); the weights topic's ``max.message.bytes`` is created to fit, at most 32 MiB (Kafka clients take records up to 64 MiB)."""
    transport: Literal["inline", "store"] = "inline"
    """``inline``: chunks travel on the weights topic; ``store``: chunks go to ``store`` and the topic carries only manifests (claim check)."""
    store: str | None = Field(default=None, validate_default=True)
    """With ``transport: store``: a directory or ``file://`` URI that every reader of the weights can also reach (a relative path resolves against the trainer's working directory; manifests carry the absolute URI)."""
    keep_versions: int | None = Field(default=None, ge=1)
    """Keep only the newest this many versions (plus the full version their deltas start from): older records are deleted from the topic, older stored chunks from the store; ``None`` keeps all."""

    @field_validator("store")
    @classmethod
    def _store_is_reachable(cls, store: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("transport") == "store" and not store:
            raise ValueError("transport 'store' needs a directory or file:// URI for the chunks")
        if store and "://" in store and not store.startswith("file://"):
            raise ValueError(f"{store!r} is not a directory or file:// URI (no other object stores are supported)")
        return store


class StopConfig(_Section):
    max_minutes: float = Field(default=10.0, gt=0.0)
    """Wall-clock budget of ``astraflow run`` after warm-up."""
    target_accuracy: float | None = Field(default=None, gt=0.0, le=1.0)
    """Stop early once held-out accuracy reaches this (``None``: run for the whole budget)."""
    max_versions: int | None = Field(default=None, ge=1)
    """Stop once the trainer has published this many versions."""
    target_gain: float | None = Field(default=None, gt=0.0, le=1.0)
    """Stop early once every policy's held-out accuracy, as the mean of its last two evaluations after the base, is this much above its base (``None``: no such stop)."""


class ScalerConfig(_Section):
    """Autoscaling of the rollout producers from the trainer's wait fraction (``astraflow scale``; rule in ``astraflow.scaler.rule``)."""

    enabled: bool = False
    """Run the scaler with ``astraflow run`` and start / stop local rollout producers to its decisions."""
    min_producers: int = Field(default=1, ge=1, le=64)
    """Fewest rollout producers the scaler asks for."""
    max_producers: int = Field(default=4, ge=1, le=64)
    """Most rollout producers the scaler asks for (``astraflow run`` also caps it at ``log.partitions``)."""
    window_s: float = Field(default=60.0, ge=1.0, le=86400.0)
    """Seconds of trainer steps and producer reports each decision looks back over."""
    interval_s: float = Field(default=10.0, gt=0.0, le=3600.0)
    """Seconds between two decisions written to the metrics topic."""
    cooldown_s: float = Field(default=60.0, ge=0.0, le=86400.0)
    """Seconds after a change (and after start) during which the decision holds, so new producers can show their effect."""
    scale_up_above: float = Field(default=0.10, gt=0.0, lt=1.0)
    """Wait fraction above which the pool grows to ⌈G / (1 − w)⌉."""
    scale_down_below: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Wait fraction below which the pool shrinks to ⌈G · consumed/entered · headroom⌉."""
    headroom: float = Field(default=1.10, ge=1.0, le=4.0)
    """Spare capacity kept when shrinking (1.10: ten per cent)."""

    @model_validator(mode="after")
    def _ordered(self) -> "ScalerConfig":
        if self.min_producers > self.max_producers:
            raise ValueError(f"min_producers ({self.min_producers}) must not exceed max_producers ({self.max_producers})")
        if self.scale_down_below > self.scale_up_above:
            raise ValueError(f"scale_down_below ({self.scale_down_below}) must not exceed scale_up_above ({self.scale_up_above})")
        return self


Role = Literal["answer", "judge"]


class PolicyRolloutConfig(_Section):
    """The per-policy part of ``rollout``; an unset field inherits the top-level one."""

    group_size: int | None = Field(default=None, ge=1, le=1024)
    """Samples of this policy per group (the judge: judgements per answer)."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Longest response of this policy in tokens."""
    temperature: float | None = Field(default=None, gt=0.0, le=10.0)
    """Sampling temperature of this policy."""


class PolicyConfig(_Section):
    """One policy of a multi-policy run: overrides of the top-level sections (only the fields written here)."""

    role: Role | None = None
    """What the policy produces; unset: the top-level ``role``."""
    model: ModelConfig | None = None
    """Overrides of ``model`` (each policy has its own weights and base checkpoint)."""
    warmup: WarmupConfig | None = None
    """Overrides of ``warmup``."""
    train: TrainConfig | None = None
    """Overrides of ``train`` (optimizer, batch size, learning rate of this policy's trainer)."""
    stream: StreamConfig | None = None
    """Overrides of ``stream`` (this policy's pipeline and staleness bound)."""
    rollout: PolicyRolloutConfig | None = None
    """Overrides of ``rollout.group_size``, ``max_new_tokens`` and ``temperature``."""
    engine: EngineConfig | None = None
    """Overrides of ``engine`` (e.g. a shorter ``simulated.median_tokens`` for a judge's turns)."""

    @model_serializer(mode="wrap")
    def _only_written(self, handler: SerializerFunctionWrapHandler) -> dict:
        """The saved config keeps only the fields written, so it loads again with the same inheritance."""
        data = handler(self)
        return {name: _written(getattr(self, name), data[name]) for name in self.model_fields_set}


def _written(value: object, dumped: object) -> object:
    """``dumped`` (the serialised ``value``) cut to the fields written, at every depth."""
    if not isinstance(value, BaseModel) or not isinstance(dumped, dict):
        return dumped
    return {name: _written(getattr(value, name), dumped[name]) for name in value.model_fields_set if name in dumped}


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


class RunConfig(_Section):
    """One AstraFlow run: what every component of it reads.

    With ``policies`` the run trains several policies at once: each gets its own base checkpoint,
    topics, stream processor, trainer and evaluator, configured by ``for_policy(name)``.
    """

    run: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]+$")
    """Run name, the prefix of every topic (``{run}.{kind}.{name}``)."""
    policy: str = Field(default="main", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the trained policy (with ``policies``: the policy this config was narrowed to by ``for_policy``)."""
    role: Role = "answer"
    """What the policy produces: ``answer`` (the task's answer) or ``judge`` (a verdict on claims ``<prompt><candidate>?``, given by writing its own answer). Picks its warm-up data and held-out evaluation."""
    mode: Literal["async", "lockstep"] = "async"
    """``async``: rollout runs ahead of training within each policy's ``stream.max_staleness``; ``lockstep``: on-policy, max_staleness 0 everywhere, and the feeder releases the next batch only once every trainer published the version trained on the previous one."""
    policies: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")], PolicyConfig] | None = None
    """Several policies trained together: name → overrides of ``role``, ``model``, ``warmup``, ``train``, ``stream``, ``engine`` and ``rollout`` (group_size, max_new_tokens, temperature), merged field by field; unset: the single ``policy``."""
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
            stream, where = (override.stream, f"policies.{name}.stream") if override and override.stream else (self.stream, "stream")
            if self.mode == "lockstep" and "max_staleness" in stream.model_fields_set and stream.max_staleness:
                raise ValueError(f"{where}.max_staleness: must be 0 (or unset) in mode 'lockstep'")
            self.for_policy(name)
        for name in self.policy_names():
            narrowed = self.for_policy(name)
            engine, train = narrowed.engine, narrowed.train
            if engine.type == train.backend == "simulated" and engine.simulated.time_scale != train.simulated.time_scale:
                raise ValueError(f"engine.simulated.time_scale ({engine.simulated.time_scale}) and train.simulated.time_scale "
                                 f"({train.simulated.time_scale}) of policy {name!r} must be equal, or the simulated cluster runs at two speeds")
        if self.rollout.workflow == "solver_verifier":
            roles = sorted(self.for_policy(name).role for name in self.policy_names())
            if roles != ["answer", "judge"]:
                raise ValueError(f"policies: workflow 'solver_verifier' needs one policy with role 'answer' and one with role 'judge', got roles {roles}")
        return self

    @model_validator(mode="after")
    def _stream_runtime_fits_the_log(self) -> "RunConfig":
        for name in self.policy_names():
            if self.log.backend == "embedded" and self.for_policy(name).stream.runtime == "faust":
                raise ValueError("stream.runtime: 'faust' runs on Kafka only (log.backend: kafka); use 'native' on the embedded log")
        return self

    def stream_runtime(self) -> str:
        """The stream runtime this (narrowed) config runs: ``stream.runtime``, else faust on Kafka, native on the embedded log."""
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
        rollout = self.rollout.model_copy(update={k: v for k in rollout_override.model_fields_set if (v := getattr(rollout_override, k)) is not None})
        return self.model_copy(update={
            "policy": name,
            "role": override.role or self.role,
            "model": _merged(self.model, override.model, f"{where}.model"),
            "warmup": _merged(self.warmup, override.warmup, f"{where}.warmup"),
            "train": _merged(self.train, override.train, f"{where}.train"),
            "stream": stream,
            "rollout": rollout,
            "engine": _merged(self.engine, override.engine, f"{where}.engine"),
        })


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
