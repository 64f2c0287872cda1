"""The ``rollout``, ``engine`` and ``agent`` sections: what the rollout producers run and generate with."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from astraflow.config.base import Section


class RolloutConfig(Section):
    workflow: Literal["single_turn", "search", "code", "rooms", "http_env", "solver_verifier"] = "single_turn"
    (
        "Episode logic run by the producers: ``single_turn`` samples one answer per prompt and scores it; the "
        "multi-turn ones (limits in ``agent``) are ``search`` (BM25 search tool), ``code`` (programs run in the "
        "sandbox), ``rooms`` (the bundled room-navigation game) and ``http_env`` (an environment served at "
        "``agent.env_url``); ``solver_verifier`` involves two ``policies``: one with ``role: answer`` answers, one "
        "with ``role: judge`` judges each answer."
    )
    reward: Literal["exact_match", "tests_passed", "env"] = "exact_match"
    (
        "Reward of the workflow: ``exact_match`` (1 for the reference answer; ``single_turn``, ``search``), "
        "``tests_passed`` (fraction of tests passed; ``code``), ``env`` (what the environment reports; ``rooms``, "
        "``http_env``)."
    )
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
    (
        "Multi-policy workflows: answers the evaluator samples per held-out prompt for the system accuracy (the judge "
        "keeps the first it accepts)."
    )


class VllmEngineOptions(Section):
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=1.0)
    """``vllm``: fraction of the GPU's memory vLLM may take (weights + KV cache)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """``vllm``: longest prompt + response in tokens; unset: the model's own limit."""


class OpenAIEngineOptions(Section):
    base_url: str | None = None
    """``openai``: the server's API root, e.g. ``http://127.0.0.1:8000/v1``; required for ``openai``."""
    model: str | None = None
    """``openai``: the served model name; unset: the first one ``/models`` lists."""
    timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0)
    """``openai``: timeout of one request."""
    max_parallel: int = Field(default=16, ge=1, le=1024)
    """``openai``: requests in flight at once (one per prompt; the ``n`` samples share it)."""
    weight_update: Literal["none", "sglang_disk"] = "none"
    (
        "``openai``: how new versions reach the server: ``none`` (it serves fixed weights; a run, which trains its "
        "policies, refuses it at load time) or ``sglang_disk`` (safetensors written to ``update_dir``, loaded by "
        "SGLang's ``/update_weights_from_disk``)."
    )
    update_dir: str | None = None
    """``openai`` with ``sglang_disk``: a directory the producer writes and the server reads at the same path."""

    @model_validator(mode="after")
    def _disk_update_needs_dir(self) -> "OpenAIEngineOptions":
        if self.weight_update == "sglang_disk" and not self.update_dir:
            raise ValueError("update_dir is required when weight_update is 'sglang_disk'")
        return self


class SimulatedEngineOptions(Section):
    """``simulated``: the time model of one GPU inference replica, for capacity planning (docs/simulated_cluster.md).

    Defaults stand for an 8B model served by vLLM on one H100 (order of magnitude, not a measurement).
    """

    decode_step_seconds: float = Field(default=0.015, ge=0.0, le=60.0)
    (
        "Seconds of one decode step (one token for every running sequence) with a single sequence running: reading the "
        "weights."
    )
    seq_step_seconds: float = Field(default=0.00008, ge=0.0, le=60.0)
    """Seconds each further running sequence adds to a decode step (reading its KV cache)."""
    max_concurrency: int = Field(default=256, ge=1, le=65536)
    """Sequences decoded at once (vLLM's ``max_num_seqs``); the others of a call wait for a free slot."""
    median_tokens: int = Field(default=600, ge=1, le=10_000_000)
    """Median response length in tokens (lognormal, cut at ``rollout.max_new_tokens``)."""
    p99_over_p50: float = Field(default=8.0, ge=1.0, le=1000.0)
    (
        "Tail of the response lengths: p99 over the median (8: reasoning-model-like; 1: every response is "
        "``median_tokens`` long)."
    )
    accuracy: float = Field(default=0.5, ge=0.0, le=1.0)
    (
        "Chance that a response to an arithmetic prompt (``12+35=``, or ``12+35=47?`` for a judge) starts with the "
        "right answer; other prompts get filler, scored 0."
    )
    load_seconds: float = Field(default=2.0, ge=0.0, le=3600.0)
    """Seconds to apply a new weight version between two generations."""
    time_scale: float = Field(default=1.0, gt=0.0, le=1000.0)
    (
        "Wall seconds slept per simulated second (0.1: a 77 s iteration takes 7.7 s); must equal "
        "``train.simulated.time_scale`` when both are simulated."
    )


class EngineConfig(Section):
    """What rollout producers generate with (``astraflow.engines``)."""

    type: Literal["torch", "vllm", "openai", "simulated"] = "torch"
    (
        "``torch``: transformers + our sampler, CPU or GPU; ``vllm``: vLLM in the producer process (GPU); ``openai``: "
        "any OpenAI-compatible server that returns token ids and log-probs; ``simulated``: no model, token ids and "
        "log-probs of the right shapes after the time of ``simulated`` (capacity planning)."
    )
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """``torch``: where the model runs; ``auto``: a CUDA GPU when one is visible."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    (
        "``torch`` / ``vllm``: weight dtype; ``auto``: bfloat16 on GPUs that support it, else float16 on GPU, float32 "
        "on CPU."
    )
    chat_template: bool = False
    """Encode each prompt as one user turn of the tokenizer's chat template, when the tokenizer has one."""
    prefix_cache_mb: int = Field(default=256, ge=0, le=1 << 20)
    (
        "``torch``: MiB of keys and values kept from the rows of the last generation, so a multi-turn episode's next "
        "turn prefills only the environment's answer, not its whole context again (vLLM caches prefixes itself); "
        "0: off."
    )
    vllm: VllmEngineOptions = VllmEngineOptions()
    openai: OpenAIEngineOptions = OpenAIEngineOptions()
    simulated: SimulatedEngineOptions = SimulatedEngineOptions()

    @model_validator(mode="after")
    def _openai_needs_url(self) -> "EngineConfig":
        if self.type == "openai" and not self.openai.base_url:
            raise ValueError("openai.base_url is required when type is 'openai' (e.g. http://127.0.0.1:8000/v1)")
        return self


class SandboxConfig(Section):
    backend: Literal["auto", "bwrap", "unshare"] = "auto"
    (
        "Isolation of model-generated programs: ``bwrap`` (bubblewrap), ``unshare`` (user namespaces + rlimits), "
        "``auto`` (the first that works); none working is an error at start-up. Both add a seccomp filter and, "
        "where the host allows, a cgroup per run; the log says what is enforced."
    )
    python: str = "/usr/bin/python3"
    """Interpreter inside the sandbox (the host's system Python, seen read-only)."""
    wall_seconds: float = Field(default=2.0, gt=0.0, le=600.0)
    """Wall-clock limit of one program run (one test of the code task); the run is killed after it."""
    cpu_seconds: int = Field(default=1, ge=1, le=600)
    """CPU-time limit of each process (RLIMIT_CPU)."""
    memory_mb: int = Field(default=256, ge=32, le=65536)
    (
        "Address-space limit of each process in MiB (RLIMIT_AS); where the host lets the sandbox make cgroups, also "
        "the memory of the whole run (plus its tmpfs)."
    )
    max_processes: int = Field(default=16, ge=2, le=4096)
    (
        "Processes and threads the program may run at once (RLIMIT_NPROC in its own user namespace, and the run's "
        "cgroup where there is one)."
    )
    max_file_mb: int = Field(default=8, ge=1, le=4096)
    """Largest file, and size of the tmpfs ``/work`` and ``/tmp``, in MiB."""
    max_output_bytes: int = Field(default=64 * 1024, ge=256, le=64 * 1024 * 1024)
    (
        "Bytes kept of a run's stdout and of its stderr (the rest is cut, and the result says so). Programs share a "
        "sandbox as far as their reports fit in ``max_file_mb``, so a small cap puts more programs in one."
    )


class AgentConfig(Section):
    """Limits and tools of the multi-turn workflows (``rollout.workflow`` other than ``single_turn``)."""

    max_turns: int = Field(default=4, ge=1, le=256)
    """Policy turns per episode (each answered by the environment)."""
    max_total_tokens: int = Field(default=256, ge=2, le=1_000_000)
    (
        "Response tokens per episode, policy and environment turns together (``rollout.max_new_tokens`` bounds one "
        "policy turn)."
    )
    max_observation_tokens: int = Field(default=64, ge=1, le=100_000)
    """Tokens kept of one environment turn (the rest is cut)."""
    max_tool_seconds: float = Field(default=30.0, gt=0.0, le=3600.0)
    """Environment / tool time per episode; past it the episode ends (``tool_time_limit``)."""
    tool_workers: int = Field(default=4, ge=1, le=256)
    """Environment steps a producer runs in parallel."""
    resume_episodes: bool = True
    (
        "Record each completed turn on ``{run}.episodes.{policy}`` in the producer's transaction, so the producer that "
        "owns a task after a crash resumes its episodes from their last completed turn instead of their first "
        '(docs/reliability.md, "Episodes across a producer crash").'
    )
    max_resumes: int = Field(default=2, ge=0, le=50)
    (
        "Times an episode may be resumed from its recorded turns; the task of an episode that would be resumed once "
        "more is dead-lettered, so an episode that crashes its producer cannot crash every producer in turn."
    )
    search_top_k: int = Field(default=1, ge=1, le=50)
    """``search``: documents returned per query."""
    corpus_file: str | None = None
    (
        "``search``: jsonl corpus of ``{doc_id, text}`` rows; unset: the one generated with the task in the run "
        "directory."
    )
    env_url: str | None = None
    (
        "``http_env``: base URL of the environment server (``reset`` / ``step`` / ``close``), ``http://`` or "
        "``https://``; its host must be on ``env_allowed_hosts`` (checked at load time)."
    )
    env_timeout_s: float = Field(default=10.0, gt=0.0, le=600.0)
    (
        "``http_env``: deadline of one request, connecting, sending and reading the whole answer together (a server "
        "that drips its answer fails the task at it)."
    )
    env_max_response_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    """``http_env``: largest answer read from the environment server; a larger one fails the task."""
    env_allowed_hosts: tuple[str, ...] = ()
    (
        "``http_env``: host names or addresses the environment server may be at; empty: only ``env_url``'s own. "
        "Redirects are never followed and proxy variables (``http_proxy``...) are ignored, so no other host is "
        "contacted."
    )
    sandbox: SandboxConfig = SandboxConfig()

    @model_validator(mode="after")
    def _env_url_is_allowed(self) -> "AgentConfig":
        if self.env_url is None:
            return self
        parts = urlsplit(self.env_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"env_url {self.env_url!r} is not an http:// or https:// URL with a host")
        allowed = {host.strip("[]").lower() for host in self.env_allowed_hosts}
        if allowed and parts.hostname not in allowed:
            raise ValueError(f"env_url's host {parts.hostname!r} is not in env_allowed_hosts {sorted(allowed)}")
        return self
