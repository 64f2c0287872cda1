"""AstraFlow's record contracts: Avro schemas (``*.avsc``), their dataclasses, and the codec.

``Codec`` turns records into Avro single-object bytes and back; ``SchemaStore`` maps writer
schema fingerprints to schemas (``astraflow.runtime.schema_store.LogSchemaStore`` shares them
through the log).
"""

from astraflow.schemas.codec import Codec, to_jsonable
from astraflow.schemas.records import (
    RECORD_TYPES,
    DeadLetter,
    LedgerEntry,
    Metric,
    OffsetRange,
    PromptStats,
    RolloutTask,
    TensorSpec,
    TrainSample,
    Trajectory,
    Turn,
    WeightChunk,
)
from astraflow.schemas.store import SCHEMA_TOPIC, SchemaStore, WriterSchema

__all__ = [
    "RECORD_TYPES",
    "SCHEMA_TOPIC",
    "Codec",
    "DeadLetter",
    "LedgerEntry",
    "Metric",
    "OffsetRange",
    "PromptStats",
    "RolloutTask",
    "SchemaStore",
    "TensorSpec",
    "TrainSample",
    "Trajectory",
    "Turn",
    "WeightChunk",
    "WriterSchema",
    "to_jsonable",
]
