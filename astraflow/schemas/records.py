"""Typed records that mirror the Avro schemas in this folder, field for field.

These dataclasses are the only things that cross a component boundary. Per-token arrays are numpy
arrays here and packed little-endian ``bytes`` on the wire (see ``codec.py``): int32 token ids,
float32 log-probs, int32 weight versions, uint8 loss masks. Nested records (``Turn``,
``TensorSpec``) are dataclasses too. Field order and names equal the ``.avsc`` files; the schema
test checks that they stay in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np


@dataclass
class RolloutTask:
    """One prompt to be sampled ``group_size`` times by a rollout producer."""

    SCHEMA: ClassVar[str] = "RolloutTask"
    task_id: str
    prompt_id: str
    group_id: str
    workflow: str
    prompt: str
    reference: str
    group_size: int
    submitted_version: int
    created_ms: int
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class Turn:
    """One contiguous span of the response: a policy turn or a tool/environment turn."""

    SCHEMA: ClassVar[str] = "Turn"
    role: str
    start: int
    end: int
    version: int


@dataclass
class Trajectory:
    """One sampled response (episode of one policy) with everything needed to train on it."""

    SCHEMA: ClassVar[str] = "Trajectory"
    trajectory_id: str
    episode_id: str
    group_id: str
    task_id: str
    prompt_id: str
    policy: str
    workflow: str
    prompt_ids: np.ndarray  # [P] int32
    response_ids: np.ndarray  # [R] int32
    behaviour_logprobs: np.ndarray  # [R] float32
    token_versions: np.ndarray  # [R] int32, the weight version that generated each token
    loss_mask: np.ndarray  # [R] uint8, 0 for tool / environment tokens
    reward: float
    reward_components: dict[str, float] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    response_text: str = ""
    finish_reason: str = "stop"
    group_size: int = 1
    producer_id: str = ""
    region: str = ""
    hardware: str = ""
    generate_ms: float = 0.0
    reward_ms: float = 0.0
    created_ms: int = 0
    producers: list[str] = field(default_factory=list)  # a resumed episode's producers, in turn order
    resumes: int = 0  # times the episode was resumed from its recorded turns

    @property
    def min_version(self) -> int:
        """Oldest weight version among the generated tokens (the sample's staleness anchor)."""
        versions = self.token_versions
        if not versions.size:
            return -1
        if self.loss_mask.all():  # the usual case: every token is the policy's (no tool output, no prompt)
            return int(versions.min())
        mask = self.loss_mask.astype(bool)
        return int((versions[mask] if mask.any() else versions).min())


@dataclass
class TrainSample:
    """A trajectory that passed the stream pipeline, with its advantage and provenance."""

    SCHEMA: ClassVar[str] = "TrainSample"
    sample_id: str
    trajectory: Trajectory
    advantage: float
    deadline_version: int
    operators: list[str] = field(default_factory=list)
    replayed: bool = False
    created_ms: int = 0
    token_advantages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    """[R] float32 or empty: one advantage per response token, used instead of ``advantage`` when given."""


@dataclass
class TensorSpec:
    """Where one tensor lives inside the concatenated payload of a weight version."""

    SCHEMA: ClassVar[str] = "TensorSpec"
    name: str
    dtype: str
    shape: list[int]
    offset: int
    length: int
    encoding: str = "raw"


@dataclass
class WeightChunk:
    """A manifest (kind="manifest") or one bounded-size payload chunk (kind="chunk")."""

    SCHEMA: ClassVar[str] = "WeightChunk"
    policy: str
    version: int
    base_version: int
    encoding: str
    kind: str
    chunk_index: int
    num_chunks: int
    total_bytes: int
    sha256: str
    data: bytes = b""
    tensors: list[TensorSpec] = field(default_factory=list)
    store_uri: str | None = None
    created_ms: int = 0
    base_sha256: str = ""
    chunk_offset: int = -1
    signature: bytes = b""
    signer: str = ""
    publish_id: str = ""


@dataclass
class OffsetRange:
    """The records [start, end) of one partition of a topic."""

    SCHEMA: ClassVar[str] = "OffsetRange"
    partition: int
    start: int
    end: int


@dataclass
class LedgerEntry:
    """What made one weight version of a policy: committed with the version by its trainer."""

    SCHEMA: ClassVar[str] = "LedgerEntry"
    policy: str
    kind: str  # "step" | "start"
    epoch: int
    version: int
    parent_epoch: int
    parent_version: int
    ranges: list[OffsetRange] = field(default_factory=list)
    sample_ids: list[str] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)
    payload_sha256: str = ""
    trained_samples: int = 0
    created_ms: int = 0


@dataclass
class PromptStats:
    """Outcome of one group of a prompt, fed back to the task feeder's curators."""

    SCHEMA: ClassVar[str] = "PromptStats"
    prompt_id: str
    group_id: str
    workflow: str
    policy: str
    version: int
    num_samples: int
    mean_reward: float
    reward_std: float
    pass_rate: float
    accepted: bool = True
    drop_reason: str = ""
    created_ms: int = 0
    trajectory_ids: list[str] = field(default_factory=list)


@dataclass
class Metric:
    """One scalar measurement by one component."""

    SCHEMA: ClassVar[str] = "Metric"
    component: str
    name: str
    value: float
    step: int
    created_ms: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class DeadLetter:
    """A record no component could process, kept with its raw bytes and the reason."""

    SCHEMA: ClassVar[str] = "DeadLetter"
    origin: str
    reason: str
    error_type: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    payload: bytes
    created_ms: int


RECORD_TYPES: dict[str, type] = {
    cls.SCHEMA: cls
    for cls in (
        RolloutTask,
        Turn,
        Trajectory,
        TrainSample,
        TensorSpec,
        WeightChunk,
        OffsetRange,
        LedgerEntry,
        PromptStats,
        Metric,
        DeadLetter,
    )
}

__all__ = [
    "RECORD_TYPES",
    "DeadLetter",
    "LedgerEntry",
    "Metric",
    "OffsetRange",
    "PromptStats",
    "RolloutTask",
    "TensorSpec",
    "TrainSample",
    "Trajectory",
    "Turn",
    "WeightChunk",
]
