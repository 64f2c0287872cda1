"""Avro single-object encoding of AstraFlow records, and back.

Wire format (Avro spec, "Single object encoding")::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema (8 bytes, little-endian) | Avro binary body

``encode`` always writes with the packaged (current) schema of ``type(record).SCHEMA``.
``decode`` looks the fingerprint up in a ``SchemaStore`` and reads the body with Avro schema
resolution from that writer schema into the packaged reader schema of the same record, so
records written by an older AstraFlow decode with new fields set to their defaults.

Per-token arrays are Avro ``bytes`` with a custom ``ndarray-*`` logical type. The conversion
to and from numpy happens here, in per-record plans compiled once from the packaged schemas,
rather than in fastavro's global logical-type registry: encoding a record then costs one
attribute read per field plus fastavro's C writer, and nothing global is changed.

Every way bytes can fail to decode raises ``SchemaError`` naming where: the header (magic, a
truncated or unknown fingerprint), the record type, or the first field of the body that does not
read or resolve (``at field <name>``: found by reading ever longer prefixes of the writer's fields,
only once a read failed), so a dead letter of undecodable bytes says which field broke.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, fields, is_dataclass
from functools import cache, lru_cache, partial
from typing import Any, Callable, TypeVar, overload

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError

from astraflow.core.errors import SchemaError
from astraflow.schemas.records import RECORD_TYPES
from astraflow.schemas.store import NAMESPACE, SchemaStore, WriterSchema, packaged_schemas

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8
NDARRAY_DTYPES = {
    "ndarray-int32": np.dtype("<i4"),
    "ndarray-float32": np.dtype("<f4"),
    "ndarray-uint8": np.dtype("u1"),
}
_READ_ERRORS = (EOFError, ValueError, TypeError, IndexError, OverflowError)

R = TypeVar("R")
Convert = Callable[[Any], Any]

_PRIMITIVE_TYPES: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool, np.bool_),
    "int": (int, np.integer),
    "long": (int, np.integer),
    "float": (float, int, np.floating, np.integer),
    "double": (float, int, np.floating, np.integer),
    "bytes": (bytes, bytearray),
    "string": (str,),
}


def _describe(value: Any) -> str:
    return f"a {type(value).__name__} ({str(value)[:40]!r})"


def _pack(dtype: np.dtype, value: Any) -> bytes:
    if not isinstance(value, (np.ndarray, list, tuple)):
        raise SchemaError(f"expected a 1-D {dtype.name} numpy array, got {_describe(value)}")
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.ndim != 1:
        raise SchemaError(f"expected a 1-D {dtype.name} array, got shape {array.shape}")
    if array.dtype != dtype:
        if not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise SchemaError(f"expected {dtype.name} values, got dtype {array.dtype}")
        cast = array.astype(dtype)
        if array.dtype.kind in "iub" and not np.array_equal(cast, array):
            raise SchemaError(f"values of dtype {array.dtype} do not fit in {dtype.name}")
        array = cast
    return array.tobytes()


def _unpack(dtype: np.dtype, value: bytes | str) -> np.ndarray:
    if isinstance(value, str):  # a field's schema default, read from a record written before the field existed:
        value = value.encode("latin-1")  # Avro writes a bytes default as a string of code points 0-255
    if len(value) % dtype.itemsize:
        raise SchemaError(f"{len(value)} bytes is not a whole number of {dtype.name} items")
    return np.frombuffer(value, dtype=dtype).copy()


def _check_items(types: tuple[type, ...], expected: str, values: Any) -> Any:
    for item in values.values() if isinstance(values, dict) else values:
        if not isinstance(item, types):
            raise SchemaError(f"holds {_describe(item)}, expected {expected} items")
    return values


def _map_list(convert: Convert, values: list[Any]) -> list[Any]:
    return [convert(v) for v in values]


@dataclass(frozen=True)
class _Field:
    """One record field: the Python types it accepts, and conversions to and from fastavro."""

    name: str
    types: tuple[type, ...] | None
    """Accepted Python types, checked before conversion; ``None`` where ``dump`` checks."""
    expected: str
    """The Avro type, for error messages."""
    dump: Convert | None = None
    load: Convert | None = None


def _field(name: str, node: Any) -> _Field:
    """How one field with Avro type ``node`` is checked and converted."""
    if isinstance(node, list):  # a union: each branch must be a primitive
        branches = [_PRIMITIVE_TYPES.get(b) if isinstance(b, str) else None for b in node]
        return _Field(name, None if None in branches else sum(branches, ()), " or ".join(map(str, node)))
    if isinstance(node, str):
        if node in _PRIMITIVE_TYPES:
            return _Field(name, _PRIMITIVE_TYPES[node], node)
        node = {"type": "record", "name": node}  # a reference to a named record
    kind = node["type"]
    if kind == "bytes" and node.get("logicalType") in NDARRAY_DTYPES:
        dtype = NDARRAY_DTYPES[node["logicalType"]]
        return _Field(name, None, node["logicalType"], partial(_pack, dtype), partial(_unpack, dtype))
    if kind == "record":
        full = node["name"] if "." in node["name"] else f"{node.get('namespace', NAMESPACE)}.{node['name']}"
        return _Field(name, None, full, lambda record: _plan(full).dump(record), lambda d: _plan(full).load(d))
    if kind in ("array", "map"):
        inner = _field(name, node["items"] if kind == "array" else node["values"])
        container = (list, tuple) if kind == "array" else (dict,)
        if inner.dump is not None and inner.load is not None:
            return _Field(name, container, kind, partial(_map_list, inner.dump), partial(_map_list, inner.load))
        check = None if inner.types is None else partial(_check_items, inner.types, inner.expected)
        return _Field(name, container, kind, check)
    return _Field(name, _PRIMITIVE_TYPES.get(kind), kind)


@dataclass(frozen=True)
class _Plan:
    """How one record type crosses between its dataclass and fastavro's dict form."""

    cls: type
    schema: WriterSchema
    header: bytes
    fields: tuple[_Field, ...]
    dumps: tuple[_Field, ...]
    loads: tuple[_Field, ...]

    splice: _Splice | None = None

    def dump(self, record: Any, only: tuple[_Field, ...] | None = None) -> dict[str, Any]:
        """The record (or its fields ``only``) as the dict fastavro writes; ``SchemaError`` names a
        field of the wrong type."""
        if type(record) is not self.cls:
            raise SchemaError(f"expected a {self.cls.__name__}, got a {type(record).__name__}")
        chosen = self.fields if only is None else only
        out = {f.name: getattr(record, f.name) for f in chosen}
        for f in chosen:
            if f.types is not None and not isinstance(out[f.name], f.types):
                raise SchemaError(f"{self.cls.__name__}.{f.name}: got {_describe(out[f.name])}, expected {f.expected}")
        for f in self.dumps if only is None else [f for f in chosen if f.dump is not None]:
            try:
                out[f.name] = f.dump(out[f.name])  # type: ignore[misc]
            except SchemaError as exc:
                raise SchemaError(f"{self.cls.__name__}.{f.name}: {exc}") from exc
        return out

    def load(self, values: dict[str, Any]) -> Any:
        """The dataclass for a dict fastavro read with this record's packaged schema (converted in place)."""
        for f in self.loads:
            try:
                values[f.name] = f.load(values[f.name])  # type: ignore[misc]
            except SchemaError as exc:
                raise SchemaError(f"{self.cls.__name__}.{f.name}: {exc}") from exc
        return self.cls(**values)


@dataclass(frozen=True)
class _Splice:
    """How a record with one nested record field is written around that field's kept bytes.

    Fields before and after the nested one are written with two schemas of their own (an Avro
    record's body is its fields' bodies, one after another), the nested record's body is copied.
    """

    field: str
    nested: str
    """Full name of the nested record type."""
    before: tuple[_Field, ...]
    after: tuple[_Field, ...]
    before_schema: dict[str, Any]
    after_schema: dict[str, Any]


def _splice(full_name: str, nodes: list[dict[str, Any]], fields_: tuple[_Field, ...]) -> _Splice | None:
    """The splice plan of a record with exactly one nested record field and only unnamed types
    elsewhere; ``None`` for any other record."""
    nested = [i for i, f in enumerate(fields_) if f.expected in packaged_schemas()]
    if len(nested) != 1:
        return None
    i = nested[0]

    def part(suffix: str, chosen: list[dict[str, Any]]) -> dict[str, Any]:
        return parse_schema({"type": "record", "name": f"{full_name}_{suffix}", "fields": chosen}, _write_hint=False)

    try:
        before, after = part("before", nodes[:i]), part("after", nodes[i + 1 :])
    except Exception:  # noqa: BLE001 - a field type that needs named schemas: no splicing for this record
        return None
    return _Splice(fields_[i].name, fields_[i].expected, fields_[:i], fields_[i + 1 :], before, after)


@cache
def _plan(full_name: str) -> _Plan:
    schema = packaged_schemas()[full_name]
    nodes = json.loads(schema.text)["fields"]
    fields_ = tuple(_field(f["name"], f["type"]) for f in nodes)
    return _Plan(
        cls=RECORD_TYPES[full_name.removeprefix(f"{NAMESPACE}.")],
        schema=schema,
        header=MAGIC + schema.fingerprint,
        fields=fields_,
        dumps=tuple(f for f in fields_ if f.dump is not None),
        loads=tuple(f for f in fields_ if f.load is not None),
        splice=_splice(full_name, nodes, fields_),
    )


class Codec:
    """Encodes records to single-object Avro bytes and decodes them with schema resolution."""

    def __init__(self, store: SchemaStore | None = None) -> None:
        self.store = SchemaStore.packaged() if store is None else store
        for schema in packaged_schemas().values():
            self.store.add(schema)

    def encode(self, record: Any) -> bytes:
        """Single-object bytes of a record, written with its packaged schema."""
        name = getattr(type(record), "SCHEMA", None)
        if not isinstance(name, str) or RECORD_TYPES.get(name) is not type(record):
            raise SchemaError(f"cannot encode a {type(record).__name__}: not an AstraFlow record type")
        plan = _plan(f"{NAMESPACE}.{name}")
        splice = plan.splice
        kept = _kept(getattr(record, splice.field, None), _plan(splice.nested).header) if splice is not None else None
        try:
            if kept is not None:  # splice.field's bytes as they were read: its arrays are not encoded again
                before, after = io.BytesIO(), io.BytesIO()
                schemaless_writer(before, splice.before_schema, plan.dump(record, splice.before))
                schemaless_writer(after, splice.after_schema, plan.dump(record, splice.after))
                return b"".join((plan.header, before.getvalue(), kept, after.getvalue()))
            buf = io.BytesIO()
            buf.write(plan.header)
            schemaless_writer(buf, plan.schema.parsed, plan.dump(record))
            return buf.getvalue()
        except (TypeError, ValueError, OverflowError) as exc:
            raise SchemaError(f"cannot encode {name}: {exc}") from exc

    @overload
    def decode(self, data: bytes) -> Any: ...

    @overload
    def decode(self, data: bytes, expect: type[R]) -> R: ...

    def decode(self, data: bytes, expect: type[Any] | None = None, keep: bool = False) -> Any:
        """The record in ``data``; with ``expect``, ``SchemaError`` unless it is of that type.

        ``keep``: the record keeps ``data`` when it was written with the current schema, and a
        record holding it in its one nested record field (a TrainSample holding a Trajectory)
        copies those bytes instead of encoding the field again. For a record nobody changes
        after decoding it (``dataclasses.replace`` makes a new record, which keeps nothing).
        """
        writer = self.writer_of(data)
        if expect is not None and writer.name != f"{NAMESPACE}.{getattr(expect, 'SCHEMA', None)}":
            raise SchemaError(f"expected a {expect.__name__} record, got a {_where(writer, data)}")
        if writer.name not in packaged_schemas():
            raise SchemaError(f"cannot decode a {_where(writer, data)}: this package ships no such record type")
        plan = _plan(writer.name)
        current = writer.fingerprint == plan.schema.fingerprint
        record = plan.load(self._read(data, writer, None if current else plan.schema))
        if keep and current:
            record.__dict__[_KEPT] = bytes(data)
        return record

    def decode_dict(self, data: bytes) -> dict[str, Any]:
        """A JSON-able dict of the record; record types this package does not ship decode too."""
        writer = self.writer_of(data)
        if writer.name in packaged_schemas():
            return to_jsonable(self.decode(data))
        return to_jsonable(self._read(data, writer, None))

    def writer_of(self, data: bytes) -> WriterSchema:
        """The writer schema named by the header of ``data`` (``UnknownSchemaError`` if unknown)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):  # None: a Kafka record without a value
            got = f"expected bytes to decode, got {type(data).__name__}"
            if data is None:
                got = "a tombstone (0 bytes), no record"
            raise SchemaError(f"value: {got}")
        if len(data) < HEADER_SIZE or data[:2] != MAGIC:
            truncated = f": a fingerprint of {len(data) - 2} of 8 bytes" if data[:2] == MAGIC else ""
            raise SchemaError(
                f"not an Avro single-object record{truncated}: expected {HEADER_SIZE}+ bytes starting with c301, "
                f"got {len(data)} bytes starting with {bytes(data[:HEADER_SIZE]).hex() or 'nothing'}"
            )
        return self.store.get(bytes(data[2:HEADER_SIZE]))

    def _read(self, data: bytes, writer: WriterSchema, reader: WriterSchema | None) -> Any:
        buf = io.BytesIO(data)
        buf.seek(HEADER_SIZE)
        try:
            values = schemaless_reader(buf, writer.parsed, None if reader is None else reader.parsed)
        except SchemaResolutionError as exc:
            at = _failing_field(data, writer, reader)
            if reader is None:
                raise SchemaError(
                    f"corrupt or truncated {_where(writer, data)}{at}: {type(exc).__name__}: {exc}"
                ) from exc
            raise SchemaError(
                f"incompatible {_where(writer, data)}{at}: its writer schema does not resolve to this "
                f"package's schema: {exc}"
            ) from exc
        except _READ_ERRORS as exc:
            at = _failing_field(data, writer, reader)
            raise SchemaError(f"corrupt or truncated {_where(writer, data)}{at}: {type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(data):
            left = len(data) - buf.tell()
            raise SchemaError(f"corrupt {_where(writer, data)}: {left} bytes left over after the body")
        return values


_KEPT = "_avro_single_object"
"""Attribute holding the single-object bytes a record was decoded from (``Codec.decode(keep=True)``)."""


def _kept(record: Any, header: bytes) -> memoryview | None:
    """The body of the bytes ``record`` was decoded from, if it kept them and they carry ``header``."""
    data = getattr(record, "__dict__", {}).get(_KEPT)
    if data is None or data[:HEADER_SIZE] != header:
        return None
    return memoryview(data)[HEADER_SIZE:]


@lru_cache(maxsize=64)
def _prefixes(writer_text: str, reader_text: str | None) -> list[tuple[str, Any, Any]]:
    """For each top-level field of the writer schema: its name, and the parsed writer (and reader)
    schemas of the record cut after it; empty where a cut does not parse on its own, or for a writer
    schema of more than 64 fields (anyone may publish one: the cuts would cost its square)."""
    writer, reader = json.loads(writer_text), None if reader_text is None else json.loads(reader_text)
    if len(writer["fields"]) > 64:
        return []
    wanted = {} if reader is None else {f["name"]: f for f in reader["fields"]}
    cuts = []
    try:
        for end, field in enumerate(writer["fields"], start=1):
            kept = writer["fields"][:end]
            cut = parse_schema({**writer, "fields": kept}, _write_hint=False)
            resolved = None
            if reader is not None:
                fields_ = [wanted[f["name"]] for f in kept if f["name"] in wanted]
                resolved = parse_schema({**reader, "fields": fields_}, _write_hint=False)
            cuts.append((field["name"], cut, resolved))
    except Exception:  # noqa: BLE001 - a cut that refers to a type defined after it: no field named
        return []
    return cuts


def _failing_field(data: bytes, writer: WriterSchema, reader: WriterSchema | None) -> str:
    """`` at field <name>``: the first top-level field whose body does not read (or resolve), for a
    reason that names it; ``""`` when the fault is not in one (every cut reads)."""
    for name, cut, resolved in _prefixes(writer.text, None if reader is None else reader.text):
        buf = io.BytesIO(data)
        buf.seek(HEADER_SIZE)
        try:
            schemaless_reader(buf, cut, resolved)
        except Exception:  # noqa: BLE001 - any failure of this cut's read is the field's
            return f" at field {name}"
    return ""


def _where(writer: WriterSchema, data: bytes) -> str:
    return f"{writer.name} record (writer fingerprint {writer.fingerprint.hex()}, {len(data)} bytes)"


def to_jsonable(value: Any) -> Any:
    """Plain JSON-able data: dataclasses become dicts, arrays lists, bytes hex strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
