"""The Avro contracts: schema files, byte-exact single-object encodings, evolution, and errors.

The fingerprint check re-derives the Parsing Canonical Form and the CRC-64-AVRO (Rabin)
fingerprint here, straight from the Avro specification, instead of trusting fastavro's.
The log-backed schema store is exercised on the embedded (SQLite) log.
Set ``ASTRAFLOW_UPDATE_GOLDEN=1`` to rewrite ``golden/schemas.json`` after a deliberate change.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastavro import schemaless_writer

from astraflow.core.errors import SchemaError, UnknownSchemaError
from astraflow.log import TopicPartition, open_log
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.schemas import (
    RECORD_TYPES,
    SCHEMA_TOPIC,
    Codec,
    DeadLetter,
    LedgerEntry,
    Metric,
    OffsetRange,
    PromptStats,
    RolloutTask,
    SchemaStore,
    TensorSpec,
    TrainSample,
    Trajectory,
    Turn,
    WeightChunk,
    to_jsonable,
)
from astraflow.schemas.store import packaged_schemas

SCHEMA_DIR = Path(__file__).parents[2] / "astraflow" / "schemas"
GOLDEN = Path(__file__).parent / "golden" / "schemas.json"
AVSC = {path.stem: json.loads(path.read_text()) for path in sorted(SCHEMA_DIR.glob("*.avsc"))}


def trajectory(region: str = "eu-west", hardware: str = "cpu") -> Trajectory:
    return Trajectory(
        trajectory_id="traj-1",
        episode_id="ep-1",
        group_id="grp-1",
        task_id="task-1",
        prompt_id="p-1",
        policy="solver",
        workflow="math",
        prompt_ids=np.array([1, 2, 3], dtype=np.int32),
        response_ids=np.array([70000, -1], dtype=np.int32),
        behaviour_logprobs=np.array([-0.5, -0.25], dtype=np.float32),
        token_versions=np.array([3, 4], dtype=np.int32),
        loss_mask=np.array([1, 0], dtype=np.uint8),
        reward=1.0,
        reward_components={"correct": 1.0},
        turns=[Turn("policy", 0, 1, 3), Turn("tool", 1, 2, 4)],
        response_text="42",
        finish_reason="stop",
        group_size=4,
        producer_id="rollout-0",
        region=region,
        hardware=hardware,
        generate_ms=12.5,
        reward_ms=0.5,
        created_ms=1_700_000_000_000,
        producers=["rollout-1", "rollout-0"],
        resumes=1,
    )


SAMPLES: dict[str, Any] = {
    "RolloutTask": RolloutTask("task-1", "p-1", "grp-1", "math", "1+1?", "2", 4, 0, 1_700_000_000_000, {"split": "a"}),
    "Turn": Turn("policy", 0, 2, 7),
    "Trajectory": trajectory(),
    "TrainSample": TrainSample(
        "s-1",
        trajectory(),
        -0.75,
        9,
        ["staleness", "grpo"],
        True,
        5,
        np.linspace(-1.0, 0.5, len(trajectory().response_ids), dtype=np.float32),
    ),
    "TensorSpec": TensorSpec("layer.0.weight", "bfloat16", [2, 3], 0, 12),
    "WeightChunk": WeightChunk(
        "solver",
        2,
        -1,
        "full",
        "manifest",
        -1,
        1,
        12,
        "ab" * 32,
        tensors=[TensorSpec("w", "float32", [3], 0, 12, "raw")],
        store_uri="file:///tmp/w",
        created_ms=6,
        chunk_offset=7,
        signature=b"\x01" * 64,
        signer="0123456789abcdef",
        publish_id="0f" * 16,
    ),
    "OffsetRange": OffsetRange(1, 40, 104),
    "LedgerEntry": LedgerEntry(
        "solver",
        "step",
        2,
        5,
        1,
        4,
        [OffsetRange(0, 10, 74), OffsetRange(1, 40, 104)],
        ["s-1", "s-2"],
        {"0": 74, "1": 104},
        "cd" * 32,
        128,
        8,
    ),
    "PromptStats": PromptStats(
        "p-1",
        "grp-1",
        "math",
        "solver",
        3,
        4,
        0.5,
        0.25,
        0.75,
        False,
        "zero_variance: all rewards equal",
        7,
        ["traj-1", "traj-2"],
    ),
    "Metric": Metric("trainer.solver", "loss", -0.125, 3, 8, {"policy": "solver"}),
    "DeadLetter": DeadLetter("stream", "bad bytes", "SchemaError", "run.trajectories.x", 0, 17, b"k", b"\x00\xff", 9),
}
NAMES = sorted(SAMPLES)


def assert_same(a: Any, b: Any) -> None:
    """Deep equality that compares numpy arrays by value and dtype."""
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


# --- an independent Parsing Canonical Form and CRC-64-AVRO, per the Avro specification -------

EMPTY64 = 0xC15D213AA4D7A795
FP_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (EMPTY64 & -(_fp & 1))
    FP_TABLE.append(_fp)


def rabin64(data: bytes) -> int:
    fp = EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ FP_TABLE[(fp ^ byte) & 0xFF]
    return fp


PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def canonical(node: Any, namespace: str, seen: set[str]) -> str:
    """[PRIMITIVES] [FULLNAMES] [STRIP] [ORDER] [WHITESPACE]; named types resolved from the .avsc files."""
    if isinstance(node, list):
        return "[" + ",".join(canonical(branch, namespace, seen) for branch in node) + "]"
    if isinstance(node, str):
        if node in PRIMITIVES:
            return f'"{node}"'
        full = node if "." in node else f"{namespace}.{node}"
        return f'"{full}"' if full in seen else canonical(AVSC[full.rsplit(".", 1)[1]], namespace, seen)
    kind = node["type"]
    if kind == "record":
        inner = node.get("namespace", namespace)
        full = f"{inner}.{node['name']}"
        seen.add(full)
        body = ",".join(f'{{"name":"{f["name"]}","type":{canonical(f["type"], inner, seen)}}}' for f in node["fields"])
        return f'{{"name":"{full}","type":"record","fields":[{body}]}}'
    if kind == "array":
        return f'{{"type":"array","items":{canonical(node["items"], namespace, seen)}}}'
    if kind == "map":
        return f'{{"type":"map","values":{canonical(node["values"], namespace, seen)}}}'
    return canonical(kind, namespace, seen)


@pytest.mark.parametrize(
    ("text", "signed"),
    [  # share/test/data/schema-tests.txt of Apache Avro
        ('"null"', 7195948357588979594),
        ('"boolean"', -6970731678124411036),
        ('"int"', 8247732601305521295),
        ('{"name":"foo","type":"fixed","size":15}', 1756455273707447556),
        ('{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}', 7843277075252814651),
    ],
)
def test_independent_rabin_matches_avro_test_vectors(text: str, signed: int) -> None:
    assert rabin64(text.encode()) == signed & 0xFFFFFFFFFFFFFFFF


@pytest.mark.parametrize("name", NAMES)
def test_header_is_magic_and_little_endian_fingerprint(name: str) -> None:
    expected = b"\xc3\x01" + struct.pack("<Q", rabin64(canonical(AVSC[name], "astraflow", set()).encode()))
    assert Codec().encode(SAMPLES[name])[:10] == expected


# --- golden bytes and round trips -------------------------------------------------------------


def golden() -> dict[str, str]:
    if os.environ.get("ASTRAFLOW_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({n: Codec().encode(SAMPLES[n]).hex() for n in NAMES}, indent=1) + "\n")
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", NAMES)
def test_encoding_is_byte_exact(name: str) -> None:
    assert Codec().encode(SAMPLES[name]).hex() == golden()[name]


@pytest.mark.parametrize("name", NAMES)
def test_golden_bytes_decode_to_the_sample(name: str) -> None:
    assert_same(Codec().decode(bytes.fromhex(golden()[name]), expect=RECORD_TYPES[name]), SAMPLES[name])


@pytest.mark.parametrize("name", NAMES)
def test_round_trip(name: str) -> None:
    codec = Codec()
    decoded = codec.decode(codec.encode(SAMPLES[name]))
    assert_same(decoded, SAMPLES[name])
    assert json.loads(json.dumps(codec.decode_dict(codec.encode(SAMPLES[name])))) == to_jsonable(SAMPLES[name])


def test_long_trajectory_round_trips_with_dtypes() -> None:
    rng = np.random.default_rng(0)
    record = dataclasses.replace(
        trajectory(),
        prompt_ids=rng.integers(0, 150_000, 300).astype(np.int32),
        response_ids=rng.integers(0, 150_000, 1024).astype(np.int32),
        behaviour_logprobs=-rng.random(1024).astype(np.float32),
        token_versions=np.repeat(np.arange(4, dtype=np.int32), 256),
        loss_mask=(rng.random(1024) > 0.1).astype(np.uint8),
        turns=[],
    )
    decoded = Codec().decode(Codec().encode(record), expect=Trajectory)
    assert_same(decoded, record)
    assert [a.flags.writeable for a in (decoded.prompt_ids, decoded.loss_mask)] == [True, True]


@pytest.mark.parametrize(
    ("field", "value", "dtype", "expected"),
    [
        ("prompt_ids", [5, 6], np.int32, [5, 6]),
        ("prompt_ids", np.array([7], dtype=np.int64), np.int32, [7]),
        ("behaviour_logprobs", np.array([-0.5, -1.0], dtype=np.float64), np.float32, [-0.5, -1.0]),
        ("loss_mask", np.array([True, False]), np.uint8, [1, 0]),
    ],
)
def test_arrays_of_compatible_dtypes_are_packed(field: str, value: Any, dtype: type, expected: list[Any]) -> None:
    decoded = Codec().decode(Codec().encode(dataclasses.replace(trajectory(), **{field: value})))
    assert getattr(decoded, field).dtype == dtype and getattr(decoded, field).tolist() == expected


# --- schema evolution -------------------------------------------------------------------------


def old_schema(name: str) -> dict[str, Any]:
    """The packaged schema of ``name`` as it was before Trajectory gained ``region`` and ``hardware`` (and
    TrainSample ``token_advantages``)."""
    schema = json.loads(packaged_schemas()[f"astraflow.{name}"].text)
    record = schema if name == "Trajectory" else next(f["type"] for f in schema["fields"] if f["name"] == "trajectory")
    record["fields"] = [f for f in record["fields"] if f["name"] not in ("region", "hardware")]
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "token_advantages"]
    return schema


def avro_values(record: Trajectory | TrainSample) -> dict[str, Any]:
    """The dict fastavro writes for a Trajectory or TrainSample, arrays packed by hand."""
    values = dataclasses.asdict(record)
    traj = values.get("trajectory", values)
    traj.update({k: v.tobytes() for k, v in traj.items() if isinstance(v, np.ndarray)})
    values.update({k: v.tobytes() for k, v in values.items() if isinstance(v, np.ndarray)})
    return values


def write_with(schema: dict[str, Any], store: SchemaStore, record: Trajectory | TrainSample) -> bytes:
    """Single-object bytes of ``record`` written with an arbitrary (older) writer schema."""
    fp = store.add(schema)
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    schemaless_writer(buf, store.get(fp).parsed, avro_values(record))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["Trajectory", "TrainSample"])
def test_old_writer_new_reader_fills_defaults(name: str) -> None:
    store = SchemaStore.packaged()
    data = write_with(old_schema(name), store, SAMPLES[name])
    assert data[2:10] != Codec().encode(SAMPLES[name])[2:10]
    decoded = Codec(store).decode(data)
    traj = decoded if name == "Trajectory" else decoded.trajectory
    assert (traj.region, traj.hardware) == ("", "")
    assert_same(traj, trajectory(region="", hardware=""))
    if name == "TrainSample":  # one advantage for the whole response, as every sample before the field
        assert decoded.token_advantages.dtype == np.float32 and decoded.token_advantages.size == 0


def test_old_writer_schema_is_found_through_the_log(tmp_path: Path) -> None:
    with open_log("embedded", path=tmp_path / "log.sqlite") as reader_log, LogSchemaStore(reader_log) as reader:
        with open_log("embedded", path=tmp_path / "log.sqlite") as writer_log:
            with LogSchemaStore(writer_log, schemas=[]) as writer:  # another process, with the old schema
                data = write_with(old_schema("Trajectory"), writer, SAMPLES["Trajectory"])
        assert data[2:10] not in reader
        decoded = Codec(reader).decode(data, expect=Trajectory)
    assert (decoded.region, decoded.hardware, decoded.trajectory_id) == ("", "", "traj-1")


def test_log_store_publishes_every_schema_once_keyed_by_fingerprint(tmp_path: Path) -> None:
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        for _ in range(2):
            LogSchemaStore(log).close()
        assert log.describe_topic(SCHEMA_TOPIC).compacted
        assert log.end_offsets(SCHEMA_TOPIC) == {0: len(RECORD_TYPES)}
        with log.consumer() as consumer:
            consumer.assign([TopicPartition(SCHEMA_TOPIC, 0)])
            records = consumer.poll(max_records=100, timeout=1.0)
    assert sorted(m.key.decode() for m in records) == sorted(s.fingerprint.hex() for s in packaged_schemas().values())
    assert {json.loads(m.value)["name"] for m in records} == set(RECORD_TYPES)


def test_log_store_names_the_topic_for_an_unknown_fingerprint(tmp_path: Path) -> None:
    with open_log("embedded", path=tmp_path / "log.sqlite") as log, LogSchemaStore(log) as store:
        with pytest.raises(UnknownSchemaError, match=f"0102030405060708.*{SCHEMA_TOPIC}"):
            Codec(store).decode(b"\xc3\x01" + bytes(range(1, 9)) + b"\x00")


def test_unshipped_record_type_decodes_only_to_a_dict() -> None:
    store = SchemaStore.packaged()
    schema = {
        "type": "record",
        "name": "Extra",
        "namespace": "astraflow",
        "doc": "x",
        "fields": [{"name": "blob", "type": "bytes", "doc": "x"}],
    }
    fp = store.add(schema)
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + fp)
    schemaless_writer(buf, store.get(fp).parsed, {"blob": b"\x01\x02"})
    assert Codec(store).decode_dict(buf.getvalue()) == {"blob": "0102"}
    with pytest.raises(SchemaError, match="astraflow.Extra.*ships no such record type"):
        Codec(store).decode(buf.getvalue())


# --- errors -----------------------------------------------------------------------------------

GOOD = Codec().encode(SAMPLES["Trajectory"])
UNKNOWN_FP = bytes.fromhex("1111111111111111")


@pytest.mark.parametrize(
    ("data", "error", "fragments"),
    [
        (b"", SchemaError, ["0 bytes", "c301"]),
        (b"hello, world", SchemaError, ["not an Avro single-object record", "68656c6c6f"]),
        (b"\xc3\x02" + GOOD[2:], SchemaError, ["c302"]),
        (GOOD[:9], SchemaError, ["9 bytes"]),
        (b"\xc3\x01" + UNKNOWN_FP + GOOD[10:], UnknownSchemaError, ["1111111111111111", "unknown writer schema"]),
        (GOOD[:-5], SchemaError, ["corrupt or truncated", "astraflow.Trajectory", GOOD[2:10].hex()]),
        (GOOD + b"\x00", SchemaError, ["1 bytes left over", "astraflow.Trajectory"]),
        ("c3 01", SchemaError, ["expected bytes", "str"]),
    ],
)
def test_bad_bytes_raise_a_clear_schema_error(data: bytes, error: type, fragments: list[str]) -> None:
    with pytest.raises(error) as caught:
        Codec().decode(data)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_decode_of_the_wrong_record_type_names_both() -> None:
    with pytest.raises(SchemaError, match="expected a Metric record, got a astraflow.Trajectory"):
        Codec().decode(GOOD, expect=Metric)


def test_array_bytes_of_a_partial_item_name_the_field() -> None:
    values = avro_values(trajectory())
    values["prompt_ids"] = b"\x01\x02\x03"
    buf = io.BytesIO()
    buf.write(GOOD[:10])
    schemaless_writer(buf, packaged_schemas()["astraflow.Trajectory"].parsed, values)
    with pytest.raises(SchemaError, match=r"Trajectory\.prompt_ids: 3 bytes is not a whole number of int32"):
        Codec().decode(buf.getvalue())


def test_random_corruption_only_ever_raises_schema_error() -> None:
    rng = random.Random(0)
    sources = [Codec().encode(SAMPLES[name]) for name in NAMES]
    for _ in range(2000):
        data = bytearray(rng.choice(sources))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(10, len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(10, len(data))]
        try:
            Codec().decode(bytes(data))
        except SchemaError:
            pass


@pytest.mark.parametrize(
    ("record", "fragments"),
    [
        (dataclasses.replace(trajectory(), reward="high"), ["Trajectory.reward", "str", "double"]),
        (dataclasses.replace(trajectory(), group_size=1.5), ["Trajectory.group_size", "float", "long"]),
        (dataclasses.replace(trajectory(), task_id=None), ["Trajectory.task_id", "NoneType", "string"]),
        (dataclasses.replace(trajectory(), prompt_ids=np.array([1.5])), ["Trajectory.prompt_ids", "float64"]),
        (dataclasses.replace(trajectory(), prompt_ids=np.zeros((2, 2), np.int32)), ["Trajectory.prompt_ids", "1-D"]),
        (dataclasses.replace(trajectory(), prompt_ids=np.array([2**40])), ["Trajectory.prompt_ids", "do not fit"]),
        (dataclasses.replace(trajectory(), loss_mask="1010"), ["Trajectory.loss_mask", "uint8"]),
        (dataclasses.replace(trajectory(), turns=[{"role": "policy"}]), ["Trajectory.turns", "expected a Turn"]),
        (dataclasses.replace(trajectory(), turns=[Turn("policy", "0", 1, 0)]), ["Trajectory.turns", "Turn.start"]),
        (dataclasses.replace(trajectory(), reward_components={"a": "1"}), ["Trajectory.reward_components", "double"]),
        (dataclasses.replace(SAMPLES["TrainSample"], trajectory=None), ["TrainSample.trajectory", "NoneType"]),
        (dataclasses.replace(SAMPLES["RolloutTask"], metadata={"k": 1}), ["RolloutTask.metadata", "int"]),
        (dataclasses.replace(SAMPLES["TensorSpec"], shape=[2, 3.0]), ["TensorSpec.shape", "float"]),
        (dataclasses.replace(SAMPLES["WeightChunk"], store_uri=5), ["WeightChunk.store_uri", "null or string"]),
        (dataclasses.replace(SAMPLES["DeadLetter"], key="k"), ["DeadLetter.key", "null or bytes"]),
        (dataclasses.replace(SAMPLES["Metric"], labels=None), ["Metric.labels", "map"]),
        ({"task_id": "t"}, ["dict", "not an AstraFlow record type"]),
    ],
)
def test_encoding_a_wrong_field_type_names_the_field(record: Any, fragments: list[str]) -> None:
    with pytest.raises(SchemaError) as caught:
        Codec().encode(record)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_invalid_schema_text_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="invalid Avro schema"):
        SchemaStore().add("{not json")
    with pytest.raises(SchemaError, match="must be an Avro record"):
        SchemaStore().add('"string"')


# --- the schema files against the dataclasses -------------------------------------------------


def test_every_record_type_has_exactly_one_schema_file() -> None:
    assert sorted(AVSC) == sorted(RECORD_TYPES)
    assert all(schema["namespace"] == "astraflow" and schema["name"] == name for name, schema in AVSC.items())


@pytest.mark.parametrize("name", NAMES)
def test_schema_fields_mirror_the_dataclass_in_order(name: str) -> None:
    assert [f["name"] for f in AVSC[name]["fields"]] == [f.name for f in dataclasses.fields(RECORD_TYPES[name])]


@pytest.mark.parametrize("name", NAMES)
def test_every_record_and_field_has_a_doc(name: str) -> None:
    assert AVSC[name]["doc"].strip()
    assert [f["name"] for f in AVSC[name]["fields"] if not str(f.get("doc", "")).strip()] == []


@pytest.mark.parametrize("name", NAMES)
def test_dataclass_defaults_are_avro_defaults(name: str) -> None:
    for f in dataclasses.fields(RECORD_TYPES[name]):
        field = next(x for x in AVSC[name]["fields"] if x["name"] == f.name)
        if f.default is not dataclasses.MISSING:
            expected = f.default.decode("latin-1") if isinstance(f.default, bytes) else f.default
            assert field["default"] == expected, f.name
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            if isinstance(default, np.ndarray):  # a packed array's default: its bytes, as Avro writes bytes
                default = default.tobytes().decode("latin-1")
            assert field["default"] == default, f.name
        elif isinstance(field["type"], list):
            assert field["type"][0] == "null" and field["default"] is None, f.name
        else:
            assert "default" not in field, f.name


@pytest.mark.parametrize(
    ("name", "field", "logical"),
    [
        ("Trajectory", "prompt_ids", "ndarray-int32"),
        ("Trajectory", "response_ids", "ndarray-int32"),
        ("Trajectory", "behaviour_logprobs", "ndarray-float32"),
        ("Trajectory", "token_versions", "ndarray-int32"),
        ("Trajectory", "loss_mask", "ndarray-uint8"),
    ],
)
def test_per_token_arrays_are_packed_bytes(name: str, field: str, logical: str) -> None:
    spec = next(f for f in AVSC[name]["fields"] if f["name"] == field)
    assert spec["type"] == {"type": "bytes", "logicalType": logical}
    assert "packed" in spec["doc"]


# --- kept bytes: a TrainSample copies the Trajectory it was decoded from -------------------------


def sample_of(traj: Trajectory) -> TrainSample:
    return TrainSample(
        sample_id="s/1",
        trajectory=traj,
        advantage=-0.5,
        deadline_version=4,
        operators=["grpo", "zero_variance"],
        replayed=True,
        created_ms=99,
    )


def test_a_kept_trajectory_is_copied_byte_for_byte_into_its_sample() -> None:
    codec = Codec()
    data = codec.encode(SAMPLES["Trajectory"])
    kept, plain = codec.decode(data, expect=Trajectory, keep=True), codec.decode(data, expect=Trajectory)
    spliced = codec.encode(sample_of(kept))
    assert spliced == codec.encode(sample_of(plain))  # what encoding every field gives
    assert data[10:] in spliced
    decoded = codec.decode(spliced, expect=TrainSample)
    assert (decoded.sample_id, decoded.advantage, decoded.operators, decoded.replayed, decoded.created_ms) == (
        "s/1",
        -0.5,
        ["grpo", "zero_variance"],
        True,
        99,
    )
    assert_same(decoded.trajectory, SAMPLES["Trajectory"])


def test_only_bytes_of_the_current_schema_are_kept() -> None:
    store = SchemaStore.packaged()
    codec = Codec(store)
    old = codec.decode(write_with(old_schema("Trajectory"), store, SAMPLES["Trajectory"]), expect=Trajectory, keep=True)
    spliced = codec.encode(sample_of(old))  # encoded field by field, with the current schema
    assert spliced[2:10] == codec.encode(SAMPLES["TrainSample"])[2:10]
    assert_same(codec.decode(spliced, expect=TrainSample).trajectory, trajectory(region="", hardware=""))


def test_a_changed_copy_of_a_kept_trajectory_is_encoded_anew() -> None:
    codec = Codec()
    kept = codec.decode(codec.encode(SAMPLES["Trajectory"]), expect=Trajectory, keep=True)
    changed = dataclasses.replace(kept, reward=-3.0)
    assert codec.decode(codec.encode(sample_of(changed)), expect=TrainSample).trajectory.reward == -3.0


def test_the_fields_around_a_kept_trajectory_are_still_checked() -> None:
    codec = Codec()
    kept = codec.decode(codec.encode(SAMPLES["Trajectory"]), expect=Trajectory, keep=True)
    with pytest.raises(SchemaError, match="advantage"):
        codec.encode(dataclasses.replace(sample_of(kept), advantage="high"))
