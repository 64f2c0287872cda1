"""A catalogue of malformed records (issue #52, item 3): the bad bytes a role other than the trainer can
put on a topic that a stream processor, a trainer or another reader takes in.

A ``Kind`` is named ``<topic>.<field>.<fault>``. It targets one topic kind (``TOPICS``), names what the
reader's rejection must name (a dead letter's reason, the monitor's note, the schema store's
``rejected``), and makes its bytes from a good record of that topic (``pipeline_runs.good_record``):
``make(kind, good, seed)``, where the seed varies which array entry, how long an id, which bytes, and
the same seed gives the same bytes. ``verdict="accept"`` marks well-formed edge values (subnormals,
unicode) that must pass untouched, so that the checks are shown to refuse nothing a producer may write.
``gap`` names the module whose reader does not reject the kind yet: the unit tests expect those to
fail (strictly), so closing one shows, and the fuzz benchmark leaves them out unless asked.

Hypothesis is not a dependency of the project: variation is seeded ``random.Random``, so every
failure replays from its kind and seed. Used by ``tests/unit/test_malformed_records.py`` (every kind
through its reader in-process) and ``benchmarks/fuzz.py`` (into live processes on both backends).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastavro import schemaless_reader, schemaless_writer

from astraflow.chaos.pipeline_runs import good_record
from astraflow.core.metric_names import TRAIN_VERSION
from astraflow.schemas.codec import HEADER_SIZE, MAGIC, Codec
from astraflow.schemas.records import DeadLetter, Metric, PromptStats, RolloutTask, TrainSample, Trajectory
from astraflow.schemas.store import writer_schema

MiB = 1 << 20
TOPICS = {
    "trajectories": Trajectory,
    "samples": TrainSample,
    "tasks": RolloutTask,
    "feedback": PromptStats,
    "metrics": Metric,
    "deadletter": DeadLetter,
    "schemas": str,
}
"""Each topic kind a non-trainer role writes and a component reads, and the record type of its good record."""
Build = Callable[[Any, random.Random, Codec], "bytes | None"]


@dataclass(frozen=True)
class Kind:
    """One malformed (or, with ``verdict="accept"``, merely unusual) record of one topic kind."""

    name: str
    field: str
    """What the reason of its rejection must name."""
    build: Build
    verdict: str = "reject"
    gap: str = ""
    """Where the fix belongs while today's reader does not reject it (``""``: it does)."""

    @property
    def topic(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def kafka_only(self) -> bool:
        """A record without a value (a tombstone), which only a Kafka topic holds. Every reader through the
        ``Log`` API reads it as an empty value (``<topic>.value.empty``); the faust runtime, as ``None``."""
        return self.name.endswith(".tombstone")


def make(kind: Kind | str, good: Any, seed: int = 0, codec: Codec | None = None) -> bytes | None:
    """The bytes ``kind`` makes of ``good`` (``None``: a tombstone); ``codec``: the one whose schema
    store the reader shares (a kind that writes with a schema of its own publishes it there)."""
    kind = KINDS[kind] if isinstance(kind, str) else kind
    return kind.build(good, random.Random(f"{kind.name}/{seed}"), codec or Codec())


def key_of(kind: Kind | str, good: Any, value: bytes | None) -> bytes | None:
    """The record key a producer of ``good`` would use: the kind breaks the value, never the key."""
    kind = KINDS[kind] if isinstance(kind, str) else kind
    if isinstance(good, Trajectory):
        return good.group_id.encode()
    if isinstance(good, TrainSample):
        return good.trajectory.group_id.encode()
    if isinstance(good, (RolloutTask, PromptStats)):
        return good.prompt_id.encode()
    if isinstance(good, Metric):
        return good.component.encode()
    if kind.topic == "schemas":
        if kind.field == "key":
            return b"0" * 16
        try:
            return writer_schema(value.decode()).fingerprint.hex().encode()
        except Exception:  # noqa: BLE001 - no schema in it: a key of its own, or compaction keeps only the last
            return kind.name.encode()
    return None


# --- builders ------------------------------------------------------------------------------------


def _value(value: Any, good: Any, rng: random.Random) -> Any:
    return value(good, rng) if callable(value) else value


def _set(**values: Any) -> Build:
    """The good record with ``values`` (a value, or ``f(good, rng)``) in place."""
    return lambda good, rng, codec: codec.encode(_replaced(good, rng, values))


def _inner(**values: Any) -> Build:
    """A sample whose trajectory has ``values`` in place."""
    return lambda good, rng, codec: codec.encode(
        dataclasses.replace(good, trajectory=_replaced(good.trajectory, rng, values))
    )


def _replaced(record: Any, rng: random.Random, values: dict[str, Any]) -> Any:
    return dataclasses.replace(record, **{name: _value(value, record, rng) for name, value in values.items()})


def _at(name: str, bad: Any) -> Callable[[Any, random.Random], np.ndarray]:
    """Array ``name`` with ``bad`` at a random entry."""

    def value(good: Any, rng: random.Random) -> np.ndarray:
        array = getattr(good, name).copy()
        with np.errstate(over="ignore"):  # -1e300 as float32 is -inf, as meant
            array[rng.randrange(len(array))] = _value(bad, good, rng)
        return array

    return value


def _resize(*names: str, length: Callable[[int, random.Random], int]) -> Build:
    """The good record with its arrays ``names`` cut or repeated to ``length(n, rng)`` entries."""

    def build(good: Any, rng: random.Random, codec: Codec) -> bytes:
        n = length(len(getattr(good, names[0])), rng)
        return codec.encode(dataclasses.replace(good, **{name: np.resize(getattr(good, name), n) for name in names}))

    return build


def _big(name: str) -> Callable[[Any, random.Random], str]:
    """An id of 2 to 4 MiB that starts like the good one."""
    return lambda good, rng: getattr(good, name) + "x" * (rng.randint(2, 4) * MiB)


def _suffix(name: str, text: str) -> Callable[[Any, random.Random], str]:
    return lambda good, rng: getattr(good, name) + text


def _raw(name: str, bad: bytes) -> Build:
    """The good record with string field ``name`` holding ``bad`` bytes (not UTF-8): written as a
    unique marker of the same length, then replaced in the encoded body."""

    def build(good: Any, rng: random.Random, codec: Codec) -> bytes:
        marker = "".join(rng.choice(string.ascii_letters) for _ in range(16))
        data = codec.encode(dataclasses.replace(good, **{name: marker}))
        assert data.count(marker.encode()) == 1, "the marker must occur once"
        return data.replace(marker.encode(), bad.ljust(16, b"x"))

    return build


def _avro_values(data: bytes, codec: Codec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body of ``data`` as fastavro reads it without the package's conversions, and its schema as JSON."""
    writer = codec.writer_of(data)
    return schemaless_reader(io.BytesIO(data[HEADER_SIZE:]), writer.parsed, None), json.loads(writer.text)


def _incompatible(name: str, avro_type: str, bad: Any) -> Build:
    """The good record written with a schema in which field ``name`` is ``avro_type`` (published to the
    codec's store, as another producer's schema would be), holding ``bad``."""

    def build(good: Any, rng: random.Random, codec: Codec) -> bytes:
        values, schema = _avro_values(codec.encode(good), codec)
        for field in schema["fields"]:
            if field["name"] == name:
                field["type"] = avro_type
                field.pop("default", None)
        written = writer_schema(schema)
        codec.store.add(written)
        buf = io.BytesIO()
        schemaless_writer(buf, written.parsed, {**values, name: bad})
        return MAGIC + written.fingerprint + buf.getvalue()

    return build


def _ragged(name: str) -> Build:
    """The good record with per-token array ``name`` one byte longer than whole items."""

    def build(good: Any, rng: random.Random, codec: Codec) -> bytes:
        values, schema = _avro_values(codec.encode(good), codec)
        writer = codec.writer_of(codec.encode(good))
        buf = io.BytesIO()
        schemaless_writer(buf, writer.parsed, {**values, name: values[name] + bytes([rng.randrange(256)])})
        return MAGIC + writer.fingerprint + buf.getvalue()

    return build


def _bytes(change: Callable[[bytes, random.Random], bytes | None]) -> Build:
    return lambda good, rng, codec: change(codec.encode(good), rng)


def _other(record: Callable[[Any], Any]) -> Build:
    """A valid record of another type, made from the good one."""
    return lambda good, rng, codec: codec.encode(record(good))


def _text(text: Callable[[Any, random.Random], str | bytes | None]) -> Build:
    """A schema-topic value (``good`` is a schema's JSON text)."""

    def build(good: Any, rng: random.Random, codec: Codec) -> bytes | None:
        value = text(good, rng)
        return value.encode() if isinstance(value, str) else value

    return build


def _nested(good: str, rng: random.Random) -> str:
    depth = rng.randint(50_000, 100_000)
    inner = '{"type": "array", "items": ' * depth + '"int"' + "}" * depth
    return json.dumps({"type": "record", "name": "Deep", "fields": [{"name": "a", "type": "int"}]}).replace(
        '"int"', inner
    )


NAN, INF = math.nan, math.inf
PER_TOKEN = ("response_ids", "behaviour_logprobs", "token_versions", "loss_mask")
T, S, TASK, F, M, D = "trajectories", "samples", "tasks", "feedback", "metrics", "deadletter"


def K(topic: str, spec: str, build: Build, verdict: str = "reject", gap: str = "", field: str = "") -> Kind:
    """Kind ``<topic>.<spec>``, where ``spec`` is ``<field>.<fault>`` (``field`` overrides the field)."""
    return Kind(f"{topic}.{spec}", field or spec.split(".", 1)[0], build, verdict, gap)


def _entry(name: str, bad: Any) -> Build:
    return _set(**{name: _at(name, bad)})


def _encodings(topic: str, expected: str, other: Callable[[Any], Any]) -> list[Kind]:
    """The faults of the bytes of any record, whatever its type (``other``: a valid record of another)."""
    return [
        K(topic, "fingerprint.unknown", _bytes(lambda d, r: MAGIC + r.randbytes(8) + d[HEADER_SIZE:])),
        K(topic, "fingerprint.truncated", _bytes(lambda d, r: d[: 2 + r.randrange(8)])),
        K(topic, "body.truncated", _bytes(lambda d, r: d[: r.randrange(HEADER_SIZE, len(d) - 1)]), field="truncated"),
        K(topic, "body.trailing", _bytes(lambda d, r: d + r.randbytes(r.randint(1, 8))), field="left over"),
        K(topic, "header.garbage", _bytes(lambda d, r: b"\0" + r.randbytes(40)), field="not an Avro single-object"),
        K(topic, "type.wrong", _other(other), field=f"expected a {expected} record"),
        K(topic, "value.empty", lambda good, rng, codec: b"", field="0 bytes"),  # on Kafka it goes as a tombstone
    ]


_KINDS = [
    # trajectories: read by the stream processor (GroupProcessor._admit)
    *(K(T, f"reward.{v}", _set(reward=v)) for v in (NAN, INF, -INF, 1e300, -1e300)),
    K(T, "reward.subnormal", _set(reward=5e-324), "accept"),
    K(T, "reward_components.nan", _set(reward_components={"found": NAN})),
    K(T, "reward_components.1e300", _set(reward_components={"found": 1e300})),
    K(T, "reward_components.many", _set(reward_components={str(i): 0.0 for i in range(100_000)})),
    K(T, "generate_ms.nan", _set(generate_ms=NAN)),
    K(T, "producers.too_many", _set(producers=[f"rollout-{i}" for i in range(1000)])),
    K(T, "producers.control", _set(producers=["rollout-0", "rollout\x00-1"])),
    K(T, "resumes.negative", _set(resumes=lambda g, r: r.choice([-1, -(2**63)]))),
    K(T, "reward_ms.inf", _set(reward_ms=INF)),
    K(T, "behaviour_logprobs.nan", _entry("behaviour_logprobs", NAN)),
    K(T, "behaviour_logprobs.-1e300", _entry("behaviour_logprobs", -1e300)),
    K(T, "behaviour_logprobs.positive", _entry("behaviour_logprobs", lambda g, r: r.uniform(0.01, 50))),
    K(T, "behaviour_logprobs.subnormal", _entry("behaviour_logprobs", -1e-45), "accept"),
    K(T, "response_ids.empty", _resize(*PER_TOKEN, length=lambda n, r: 0)),
    K(T, "prompt_ids.empty", _set(prompt_ids=np.zeros(0, np.int32))),
    *(
        K(T, f"{name}.mismatched", _resize(name, length=lambda n, r: r.choice([n - 1, n + 1, 2 * n])))
        for name in PER_TOKEN[1:]
    ),
    K(T, "response_ids.1M", _resize(*PER_TOKEN, length=lambda n, r: 1 << 20)),
    K(T, "prompt_ids.1M", _resize("prompt_ids", length=lambda n, r: 1 << 20)),
    K(T, "response_ids.negative", _entry("response_ids", lambda g, r: -r.randint(1, 2**31))),
    K(T, "response_ids.beyond_vocabulary", _entry("response_ids", 2**31 - 1)),
    K(T, "loss_mask.3", _entry("loss_mask", 3)),
    *(K(T, f"{name}.empty", _set(**{name: ""})) for name in ("trajectory_id", "group_id", "prompt_id")),
    *(K(T, f"{name}.MiB", _set(**{name: _big(name)})) for name in ("trajectory_id", "group_id")),
    K(T, "trajectory_id.nul", _set(trajectory_id=_suffix("trajectory_id", "\0"))),
    K(T, "group_id.separator", _set(group_id=_suffix("group_id", "\x1fx"))),
    K(T, "prompt_id.not_utf8", _raw("prompt_id", b"\xff\xfe")),
    K(T, "trajectory_id.surrogate", _raw("trajectory_id", b"\xed\xa0\x80")),
    K(T, "trajectory_id.unicode", _set(trajectory_id=_suffix("trajectory_id", "·τροχιά😀")), "accept"),
    K(T, "prompt_id.unicode", _set(prompt_id=_suffix("prompt_id", "·問題")), "accept"),
    K(T, "token_versions.negative", _entry("token_versions", -1)),
    K(T, "token_versions.far_past", _entry("token_versions", -(2**31))),
    K(T, "token_versions.future", _entry("token_versions", 2**31 - 1)),
    K(T, "group_size.plus_one", _set(group_size=lambda g, r: g.group_size + 1)),
    K(T, "group_size.minus_one", _set(group_size=lambda g, r: g.group_size - 1)),
    K(T, "group_size.not_positive", _set(group_size=lambda g, r: r.choice([0, -1, -(2**63)]))),
    K(T, "policy.other", _set(policy="verifier")),
    K(T, "reward.as_string", _incompatible("reward", "string", "high")),
    K(T, "behaviour_logprobs.ragged", _ragged("behaviour_logprobs")),
    *_encodings(T, "Trajectory", lambda good: good_record(M)),
    K(T, "value.tombstone", lambda good, rng, codec: None),  # on Kafka, as the faust runtime reads it
    # samples: written by the stream, read by the trainer (Trainer._admit, sample_checks.sample_problem)
    *(K(S, f"advantage.{v}", _set(advantage=v)) for v in (NAN, INF, 1e300)),
    K(S, "advantage.subnormal", _set(advantage=5e-324), "accept"),
    K(S, "token_advantages.nan", _set(token_advantages=np.array([1.0, NAN, 1.0], np.float32))),
    K(
        S,
        "token_advantages.mismatched",
        _set(token_advantages=lambda g, r: np.ones(r.choice([1, 2, 4, 99]), np.float32)),
    ),
    K(S, "sample_id.empty", _set(sample_id="")),
    K(S, "sample_id.MiB", _set(sample_id=_big("sample_id"))),
    K(S, "sample_id.nul", _set(sample_id=_suffix("sample_id", "\0"))),
    K(S, "reward.nan", _inner(reward=NAN)),
    K(S, "behaviour_logprobs.positive", _inner(behaviour_logprobs=np.full(3, 0.5, np.float32))),
    K(S, "token_versions.negative", _inner(token_versions=np.full(3, -1, np.int32))),
    K(S, "group_size.plus_one", _inner(group_size=lambda g, r: g.group_size + 1)),
    K(S, "group_id.empty", _inner(group_id="")),
    K(S, "group_id.MiB", _inner(group_id=_big("group_id"))),
    *_encodings(S, "TrainSample", lambda good: good.trajectory),
    # tasks: written by the feeder, read by rollout producers (RolloutProducer._runnable, task_problem)
    *(K(TASK, f"group_size.{v}", _set(group_size=v)) for v in (0, -1, 1025)),
    K(TASK, "group_size.plus_one", _set(group_size=lambda g, r: g.group_size + 1)),
    K(TASK, "metadata.not_a_number", _set(metadata={"version.main": "nan"})),
    K(TASK, "metadata.superscript", _set(metadata={"version.main": "²"})),
    K(TASK, "metadata.future", _set(metadata={"version.main": str(2**31)})),
    K(TASK, "task_id.empty", _set(task_id="")),
    K(TASK, "task_id.MiB", _set(task_id=_big("task_id"))),
    K(TASK, "group_id.nul", _set(group_id=_suffix("group_id", "\0"))),
    *_encodings(TASK, "RolloutTask", lambda good: good_record(F)),
    # feedback: written by the stream (and the trainer), read by the feeder (FeedbackReader._take)
    *(K(F, f"mean_reward.{v}", _set(mean_reward=v)) for v in (NAN, INF, 1e300)),
    *(K(F, f"reward_std.{v}", _set(reward_std=v)) for v in (NAN, -1.0)),
    *(K(F, f"pass_rate.{v}", _set(pass_rate=v)) for v in (NAN, -INF, 2.0)),
    K(F, "pass_rate.subnormal", _set(pass_rate=5e-324), "accept"),
    K(F, "num_samples.0", _set(num_samples=0, trajectory_ids=[])),
    K(F, "trajectory_ids.mismatched", _set(trajectory_ids=lambda g, r: g.trajectory_ids[:-1])),
    K(F, "trajectory_ids.1M", _set(trajectory_ids=["x"] * (1 << 20))),
    K(F, "version.negative", _set(version=lambda g, r: r.choice([-1, -(2**63)]))),
    *(K(F, f"{name}.empty", _set(**{name: ""})) for name in ("group_id", "prompt_id")),
    K(F, "group_id.MiB", _set(group_id=_big("group_id"))),
    K(F, "policy.unknown", _set(policy="ghost")),
    K(F, "policy.separator", _set(policy="main\x1fg")),
    K(F, "prompt_id.unicode", _set(prompt_id=_suffix("prompt_id", "·問題😀")), "accept"),
    *_encodings(F, "PromptStats", lambda good: good_record(M)),
    # metrics: every role's, read by the launcher's monitor (RunMonitor), the scaler, the exporters
    *(K(M, f"value.{v}", _set(value=v)) for v in (NAN, INF, -INF)),
    *(K(M, f"value.{v}", _set(value=v), "accept") for v in (1e300, 5e-324)),
    K(M, "name.empty", _set(name="")),
    K(M, "name.MiB", _set(name=lambda g, r: "x" * r.randint(2, 4) * MiB)),
    K(M, "name.own_prefix_MiB", _set(name=lambda g, r: "stream." + "x" * MiB)),
    K(M, "name.nul", _set(name="stream.group\0reward")),
    K(M, "labels.many", _set(labels={str(i): "x" for i in range(10_000)})),
    K(M, "name.forged", _set(name=TRAIN_VERSION), field=TRAIN_VERSION),
    *_encodings(M, "Metric", lambda good: good_record(D)),
    # dead letters: every role's, read by the monitor, ``audit`` and ``stats`` (runtime/control.py)
    K(D, "topic.not_read", _set(topic=lambda g, r: g.topic.replace(".trajectories.", ".samples."))),
    K(D, "topic.other_run", _set(topic="other.trajectories.main")),
    *(K(D, f"{name}.negative", _set(**{name: -7})) for name in ("partition", "offset")),
    *(K(D, f"{name}.empty", _set(**{name: ""})) for name in ("origin", "reason")),
    K(D, "topic.position_without", _set(topic="", partition=0, offset=5)),
    *_encodings(D, "DeadLetter", lambda good: good_record(M)),
    # schema records: anyone's, read by every process's LogSchemaStore at start and on unknown fingerprints
    K("schemas", "value.not_utf8", _text(lambda good, rng: b"\xff\xfe" + good.encode())),
    K("schemas", "schema.empty", _text(lambda good, rng: "")),
    K("schemas", "schema.not_json", _text(lambda good, rng: good[: rng.randrange(1, len(good) - 1)])),
    K("schemas", "schema.not_record", _text(lambda good, rng: rng.choice(['"int"', "[]", "{}", "null"]))),
    K("schemas", "schema.unknown_type", _text(lambda good, rng: good.replace('"int"', '"fuzz.Nowhere"'))),
    K("schemas", "schema.nested_too_deep", _text(_nested)),
    K("schemas", "key.not_fingerprint", _text(lambda good, rng: good)),
]
KINDS: dict[str, Kind] = {kind.name: kind for kind in _KINDS}
assert len(KINDS) == len(_KINDS), "kind names are unique"


def kinds(topic: str | None = None, verdict: str | None = None) -> list[Kind]:
    """The catalogue's kinds, of one topic kind and verdict where given."""
    return [k for k in _KINDS if topic in (None, k.topic) and verdict in (None, k.verdict)]
