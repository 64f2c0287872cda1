"""Writer schemas by fingerprint: the packaged ``.avsc`` files, plus the log's schema topic.

A single-object encoded record names its writer schema only by the 8-byte CRC-64-AVRO
fingerprint of the schema's Parsing Canonical Form, so a reader needs a place that maps
fingerprints back to schemas. ``SchemaStore`` holds the schemas it was given (at least the ones
shipped in this package); ``astraflow.runtime.schema_store.LogSchemaStore`` also publishes them to
the compacted topic ``SCHEMA_TOPIC`` and looks unknown fingerprints up there, so a process can read
records written by an older or newer AstraFlow whose schemas it does not ship. This module knows no
log: the schema layer sits beside the log, not above it.

Every schema here is *standalone*: the ``.avsc`` files refer to each other's records by name
(``"astraflow.Turn"``), and loading inlines each named type at its first use, as Avro requires
of a schema that travels on its own.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Iterator

from fastavro import parse_schema
from fastavro.schema import SchemaParseException, to_parsing_canonical_form
from fastavro.schema import fingerprint as _fastavro_fingerprint

from astraflow.core.errors import SchemaError, UnknownSchemaError

logger = logging.getLogger(__name__)

SCHEMA_TOPIC = "_astraflow.schemas"
NAMESPACE = "astraflow"
_SCHEMA_DIR = Path(__file__).parent
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


@dataclass(frozen=True)
class WriterSchema:
    """One standalone schema and its identity on the wire."""

    fingerprint: bytes
    """CRC-64-AVRO of the Parsing Canonical Form, 8 bytes in wire (little-endian) order."""
    name: str
    """Full name of the top-level record, e.g. ``astraflow.Trajectory``."""
    text: str
    """The standalone schema as JSON text, with docs, defaults and logical types."""
    parsed: dict[str, Any]
    """The schema as parsed by fastavro, ready for ``schemaless_reader``/``writer``."""


def fingerprint(schema: dict[str, Any]) -> bytes:
    """CRC-64-AVRO fingerprint of a standalone schema, little-endian as in single-object encoding."""
    return bytes.fromhex(_fastavro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def writer_schema(schema: str | dict[str, Any]) -> WriterSchema:
    """Parse a standalone record schema (JSON text or dict); ``SchemaError`` says what is wrong."""
    try:
        raw = json.loads(schema) if isinstance(schema, str) else schema
        parsed = parse_schema(raw) if isinstance(raw, dict) and raw.get("type") == "record" else None
        fp = fingerprint(raw)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, SchemaParseException) as exc:
        # RecursionError: a schema nested deeper than Python recurses (json or fastavro), from anyone's bytes
        raise SchemaError(f"invalid Avro schema: {type(exc).__name__}: {str(exc)[:200]}") from exc
    if parsed is None:
        raise SchemaError(f"a writer schema must be an Avro record, got {str(raw)[:80]!r}")
    return WriterSchema(fp, parsed["name"], json.dumps(raw), parsed)


def _standalone(root: dict[str, Any], definitions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Copy of ``root`` with every named-type reference inlined at its first occurrence."""
    defined: set[str] = set()

    def walk(node: Any, namespace: str) -> Any:
        if isinstance(node, list):
            return [walk(branch, namespace) for branch in node]
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return node
            full = node if "." in node else f"{namespace}.{node}"
            if full in defined:
                return full
            if full not in definitions:
                raise SchemaError(f"schema {root['name']!r} refers to unknown type {node!r}")
            return walk(definitions[full], namespace)
        kind = node["type"]
        if kind == "record":
            inner = node.get("namespace", namespace)
            defined.add(f"{inner}.{node['name']}")
            return {**node, "fields": [{**f, "type": walk(f["type"], inner)} for f in node["fields"]]}
        if kind == "array":
            return {**node, "items": walk(node["items"], namespace)}
        if kind == "map":
            return {**node, "values": walk(node["values"], namespace)}
        return node

    return walk(root, root.get("namespace", NAMESPACE))


@cache
def packaged_schemas() -> dict[str, WriterSchema]:
    """The schemas shipped in this package, standalone, by full record name."""
    definitions = {}
    for path in sorted(_SCHEMA_DIR.glob("*.avsc")):
        raw = json.loads(path.read_text())
        definitions[f"{raw.get('namespace', NAMESPACE)}.{raw['name']}"] = raw
    return {name: writer_schema(_standalone(raw, definitions)) for name, raw in definitions.items()}


class SchemaStore:
    """Maps fingerprints to writer schemas; ``packaged()`` knows the schemas this package ships."""

    def __init__(self, schemas: Iterable[WriterSchema] = ()) -> None:
        self._by_fingerprint: dict[bytes, WriterSchema] = {s.fingerprint: s for s in schemas}

    @staticmethod
    def packaged() -> "SchemaStore":
        """A store holding the current version of every schema shipped in the package."""
        return SchemaStore(packaged_schemas().values())

    def add(self, schema: str | dict[str, Any] | WriterSchema) -> bytes:
        """Learn a standalone writer schema (JSON text, dict or parsed); return its fingerprint."""
        parsed = schema if isinstance(schema, WriterSchema) else writer_schema(schema)
        self._by_fingerprint.setdefault(parsed.fingerprint, parsed)
        return parsed.fingerprint

    def get(self, fp: bytes) -> WriterSchema:
        """The writer schema with this fingerprint; ``UnknownSchemaError`` if the store lacks it."""
        found = self._by_fingerprint.get(fp)
        if found is None:
            raise UnknownSchemaError(f"unknown writer schema fingerprint {fp.hex()}: {self._where()}")
        return found

    def __contains__(self, fp: object) -> bool:
        return fp in self._by_fingerprint

    def __iter__(self) -> Iterator[WriterSchema]:
        return iter(list(self._by_fingerprint.values()))

    def _where(self) -> str:
        return f"not among the {len(self._by_fingerprint)} schemas this store knows"
