"""``astraflow export``: one topic's records as a file for pandas or HF datasets (jsonl or parquet).

Each row is one record's fields, decoded with the project codec (the writer schema found by its
fingerprint, through the log's schema topic), plus ``_partition``, ``_offset`` and
``_timestamp_ms`` so a row can be traced back to the log (and replayed from there).

- **jsonl**: ``to_jsonable`` of the record: arrays as lists, bytes as hex strings.
- **parquet** (needs ``pyarrow``): columns typed from the record's Avro schema, not guessed from
  the data: ``ndarray-*`` bytes become ``list<int32|float32|uint8>``, maps ``map<string, T>``,
  nested records structs, ``bytes`` binary, a union with ``null`` a nullable column.

The export reads a snapshot (``attach.read_snapshot``), so on a live topic it writes what was there
when it started. Records that cannot be decoded, or (parquet) that are of another type than the
first, are not written; they are counted with their reason in ``ExportResult.skipped``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from astraflow.core.errors import AstraFlowError, ConfigError, MissingDependencyError, SchemaError
from astraflow.log import Log, Message
from astraflow.runtime.attach import decode_snapshot
from astraflow.schemas.codec import NDARRAY_DTYPES, to_jsonable
from astraflow.schemas.store import NAMESPACE, packaged_schemas

FORMATS = ("jsonl", "parquet")
BATCH_ROWS = 1000
_PRIMITIVES = {
    "boolean": "bool_",
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "bytes": "binary",
    "string": "string",
}


@dataclass
class ExportResult:
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


def export_topic(log: Log, topic: str, fmt: str, out: Path) -> ExportResult:
    """Write every record of ``topic`` to ``out`` as ``fmt`` (``jsonl`` or ``parquet``)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--to: {fmt!r} is not a format; choose one of {', '.join(FORMATS)}")
    log.describe_topic(topic)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = _ParquetRows(out) if fmt == "parquet" else _JsonlRows(out)
    result = ExportResult()
    try:
        for message, record in decode_snapshot(log, topic):
            if isinstance(record, AstraFlowError):
                result.skipped[f"undecodable: {type(record).__name__}"] += 1
                continue
            reason = writer.add(message, record)
            if reason is None:
                result.rows += 1
            else:
                result.skipped[reason] += 1
    finally:
        writer.close()
    return result


def _meta(message: Message) -> dict[str, int]:
    return {"_partition": message.partition, "_offset": message.offset, "_timestamp_ms": message.timestamp_ms}


class _JsonlRows:
    def __init__(self, out: Path) -> None:
        self._file = out.open("w")

    def add(self, message: Message, record: Any) -> str | None:
        self._file.write(json.dumps(to_jsonable(record) | _meta(message)) + "\n")
        return None

    def close(self) -> None:
        self._file.close()


class _ParquetRows:
    """Rows buffered ``BATCH_ROWS`` at a time into one parquet file, typed by the first record."""

    def __init__(self, out: Path) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise MissingDependencyError(
                "--to parquet needs pyarrow: `uv pip install pyarrow` (or `pip install 'astraflow[export]'`)"
            ) from exc
        self._pa, self._pq, self._out = pa, pq, out
        self._type: type | None = None
        self._schema: Any = None
        self._writer: Any = None
        self._rows: list[dict[str, Any]] = []

    def add(self, message: Message, record: Any) -> str | None:
        if self._type is None:
            self._type = type(record)
            self._schema = arrow_schema(type(record).SCHEMA, self._pa)
            self._writer = self._pq.ParquetWriter(self._out, self._schema)
        elif type(record) is not self._type:
            return f"a {type(record).__name__} record among {self._type.__name__} records"
        self._rows.append(_plain(record) | _meta(message))
        if len(self._rows) >= BATCH_ROWS:
            self._flush()
        return None

    def close(self) -> None:
        if self._writer is None:
            self._pq.write_table(self._pa.table({}), self._out)
            return
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._pa.Table.from_pylist(self._rows, schema=self._schema))
            self._rows = []


def _plain(value: Any) -> Any:
    """A record as pyarrow takes it: dataclasses as dicts; arrays, maps and bytes as they are."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def arrow_schema(record_type: str, pa: Any) -> Any:
    """The Arrow schema of a packaged record type, with the ``_partition/_offset/_timestamp_ms`` columns."""
    schema = json.loads(packaged_schemas()[f"{NAMESPACE}.{record_type}"].text)
    named: dict[str, Any] = {}
    columns = [
        pa.field(f["name"], _arrow_type(f["type"], pa, named), nullable=_nullable(f["type"])) for f in schema["fields"]
    ]
    return pa.schema(
        columns + [pa.field(name, pa.int64(), nullable=False) for name in ("_partition", "_offset", "_timestamp_ms")]
    )


def _nullable(node: Any) -> bool:
    return isinstance(node, list) and "null" in node


def _arrow_type(node: Any, pa: Any, named: dict[str, Any]) -> Any:
    """Arrow type of an Avro type; ``named`` collects record types for later references by name."""
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        if len(branches) != 1:
            raise SchemaError(f'cannot export the union {node} to parquet: only ["null", T] unions map to a column')
        return _arrow_type(branches[0], pa, named)
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return getattr(pa, _PRIMITIVES[node])()
        return named[node if "." in node else f"{NAMESPACE}.{node}"]
    kind = node["type"]
    if kind == "bytes" and node.get("logicalType") in NDARRAY_DTYPES:
        return pa.list_(pa.from_numpy_dtype(NDARRAY_DTYPES[node["logicalType"]]))
    if kind == "record":
        full = node["name"] if "." in node["name"] else f"{node.get('namespace', NAMESPACE)}.{node['name']}"
        named[full] = pa.struct(
            [
                pa.field(f["name"], _arrow_type(f["type"], pa, named), nullable=_nullable(f["type"]))
                for f in node["fields"]
            ]
        )
        return named[full]
    if kind == "array":
        return pa.list_(_arrow_type(node["items"], pa, named))
    if kind == "map":
        return pa.map_(pa.string(), _arrow_type(node["values"], pa, named))
    if kind == "enum":
        return pa.string()
    return _arrow_type(kind, pa, named)
