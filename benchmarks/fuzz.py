"""Fuzz: every malformed kind (``astraflow/chaos/malformed.py``) into live stream and trainer processes.

Per backend (``--backends``): ``embedded`` (the embedded log, the ``native`` stream runtime) and
``kafka`` (a local broker started fresh, the ``faust`` runtime). On each, two runs of a ``Pipeline``
(``astraflow/chaos/pipeline_runs.py``: ``astraflow stream`` and ``astraflow train`` on a tiny model)
replay one recorded good stream - ``--groups`` good trajectory groups, and a group for each ``accept``
kind (subnormals, unicode ids: they must train like good ones) - written before the processes start:

- clean: the good stream alone;
- fuzzed: the same records in the same order, with a bad group after each good group (round robin, the
  rest at the end): a kind's bad trajectory as member 0 and three good siblings. Before them, on the
  samples topic, a bad group per sample kind: the kind's record and three samples of NaN advantage, so
  every batch of good samples is the clean run's; on the schema topic, the schema kinds (each process
  reads the whole topic at start). Kinds with a ``gap`` are left out unless ``--include-gaps``, and a
  tombstone only a Kafka topic holds is left out on the embedded log.

Checked per backend, from the records: each bad record dead-lettered once, by a reason naming its field;
no process restarted more than once (the benchmark restarts one that exits, and counts); no stage
stalled more than ``--stall-s`` (the longest time between two of its records - dead letters, feedback,
samples for the stream; versions and dead letters for the trainer - and from its last one to the end
where the run falls short); the ledgers of the two runs: the same sample ids for every version. Then the
readers of the topics no stream or trainer reads take their kinds in-process from the same live log:
the feeder's ``FeedbackReader`` (feedback), the launcher's ``RunMonitor`` with its ``ForgeryReporter``
(metrics, dead letters), a rollout producer's checks (tasks), a new ``LogSchemaStore`` (schema
records): each rejected once with the field, nothing raised.

Writes ``results/fuzz.json`` and ``results/fuzz.png`` (``--out``; a run of some ``--kinds`` only must
name its own ``--out``).

    .venv/bin/python benchmarks/fuzz.py [--backends embedded,kafka] [--groups 16] [--kinds 'trajectories.reward.*']
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import platform
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from astraflow.chaos.malformed import Kind, key_of, kinds, make
from astraflow.chaos.pipeline_runs import BATCH, CODEC, GROUP, Pipeline, good_group, good_record
from astraflow.config import load_config
from astraflow.runtime.attach import read_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.schemas.codec import Codec
from astraflow.schemas.store import SCHEMA_TOPIC
from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BACKENDS = {"embedded": "native", "kafka": "faust"}
ATTACHED = ("tasks", "feedback", "metrics", "deadletter", "schemas")
FILLER = "samples.advantage.nan"
"""The kind of the three other members of a bad sample group: rejected, each with an id of its own."""


def chosen(patterns: str, include_gaps: bool, backend: str) -> list[Kind]:
    """The catalogue's kinds matching ``patterns`` (comma-separated globs), without gaps unless asked,
    without what ``backend`` cannot hold."""
    globs = [p for p in patterns.split(",") if p] or ["*"]
    return [
        k
        for k in kinds()
        if any(fnmatch.fnmatch(k.name, g) for g in globs)
        and (include_gaps or not k.gap)
        and not (k.kafka_only and backend != "kafka")
    ]


class Injector:
    """Writes records to the run's topics and remembers where each bad one went: (topic, offset) by kind,
    where its fate is looked up. One producer, one partition, and no other writer while it writes, so
    the n-th record sent to a topic lands at the topic's end offset before the first plus n."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.next: dict[str, int] = {}
        self.records: dict[str, list[tuple[str, int]]] = {}
        self.notes: list[str] = []
        """The monitor's notes of the undecodable metrics it skipped (``attach``)."""

    def send(self, topic: str, value: bytes | None, key: bytes | None, kind: Kind | None = None) -> None:
        if topic not in self.next:
            self.next[topic] = sum(self.pipeline.log.end_offsets(topic).values())
        if kind is not None:
            self.records.setdefault(kind.name, []).append((topic, self.next[topic]))
        self.pipeline.producer.send(topic, value, key=key, partition=0)
        self.next[topic] += 1

    def flush(self) -> None:
        self.pipeline.producer.flush()
        self.next = {}  # others write once the processes run: where to write is read again


def recorded_stream(accepted: list[Kind], groups: int, run: str) -> list[tuple[list[bytes], bytes | None]]:
    """The good stream both runs replay: (encoded members, key) of ``groups`` good groups, then a group per
    accept kind, made even so that every version is a whole batch."""
    stream = []
    for index in range(groups + (groups + len(accepted)) % 2):
        gid = f"good{index}"
        stream.append(([CODEC.encode(m) for m in good_group("trajectories", gid, run)], gid.encode()))
    for index, kind in enumerate(accepted):
        members = good_group("trajectories", f"edge{index}", run)
        value = make(kind, members[0], index, CODEC)
        stream.append(([value] + [CODEC.encode(m) for m in members[1:]], key_of(kind, members[0], value)))
    return stream


def one_run(root: Path, backend: str, bootstrap: str | None, fuzz: list[Kind] | None, args: Any) -> dict:
    """One run of the good stream, with the bad records of ``fuzz`` interleaved (``None``: clean)."""
    name = f"fuzz{'bad' if fuzz is not None else 'clean'}{backend}"
    log = {"backend": backend, "bootstrap": bootstrap} if backend == "kafka" else {"backend": "embedded"}
    pipeline = Pipeline(root / name, BACKENDS[backend], log, name=name)
    schemas = LogSchemaStore(pipeline.log)
    codec = Codec(schemas)  # a kind written with a schema of its own publishes it where the processes look
    out = Injector(pipeline)
    accepted = [k for k in chosen(args.kinds, True, backend) if k.verdict == "accept" and k.topic == "trajectories"]
    stream = recorded_stream(accepted, args.groups, name)
    versions = len(stream) * GROUP // BATCH
    trajectories, samples = pipeline.topics.trajectories("main"), pipeline.topics.samples("main")
    bad = [k for k in fuzz or [] if k.verdict == "reject"]
    try:
        for index, kind in enumerate(k for k in bad if k.topic == "schemas"):
            good = good_record("schemas", f"s{index}")
            value = make(kind, good, 0, codec)
            out.send(SCHEMA_TOPIC, value, key_of(kind, good, value), kind)
        out.flush()  # before a kind written with a schema of its own publishes it there
        sample_kinds = [k for k in bad if k.topic == "samples"]
        for index, kind in enumerate(sample_kinds + [KIND_OF[FILLER]] * (len(sample_kinds) % 2)):
            members = good_group("samples", f"bad-s{index}", name)  # an even number of groups: whole batches
            key = members[0].trajectory.group_id.encode()
            out.send(samples, make(kind, members[0], 0, codec), key, kind)
            for seed, member in enumerate(members[1:], start=1):
                out.send(samples, make(FILLER, member, seed, codec), key)
        bad_groups = []
        for index, kind in enumerate(k for k in bad if k.topic == "trajectories"):
            members = good_group("trajectories", f"bad-t{index}", name)
            value = make(kind, members[0], 0, codec)
            bad_groups.append((kind, [value] + [CODEC.encode(m) for m in members[1:]], key_of(kind, members[0], value)))
        for kind, values, key in interleave(stream, bad_groups):
            out.send(trajectories, values[0], key, kind)
            for value in values[1:]:
                out.send(trajectories, value, key)
        out.flush()
        started = time.time()
        pipeline.start("train")
        pipeline.start("stream")
        version, _ = pipeline.wait_for_version(versions, timeout=args.timeout, restart=True)
        ended = time.time()
        pipeline.stop()
        result = {
            "run": name,
            "versions": version,
            "target_versions": versions,
            "wall_s": round(ended - started, 1),
            "restarts": dict(pipeline.restarts),
            "stalls_s": stalls(pipeline, started, ended, version < versions),
            "ledger": {str(v): ids for v, ids in sorted(pipeline.ledger().items())},
            "kinds": {},
        }
        if fuzz is not None:
            attach(pipeline, out, codec, [k for k in fuzz if k.topic in ATTACHED])
            result["kinds"] = fates(pipeline, out)
        return result
    finally:
        schemas.close()
        pipeline.close()


KIND_OF = {kind.name: kind for kind in kinds()}


def interleave(stream: list, bad: list) -> list[tuple[Kind | None, list[bytes], bytes | None]]:
    """The good groups in order, a bad group after each while any is left, the rest at the end."""
    order: list[tuple[Kind | None, list[bytes], bytes | None]] = []
    for index, (values, key) in enumerate(stream):
        order.append((None, values, key))
        order += bad[index : index + 1]
    return order + bad[len(stream) :]


def attach(pipeline: Pipeline, out: Injector, codec: Codec, chosen_kinds: list[Kind]) -> None:
    """Write the kinds of the topics no stream or trainer reads to the live log, once the processes have
    stopped, and run their readers in-process: a rollout producer's task checks (dead letters of the
    ``producer`` role, written here as its outbox would), the feeder's ``FeedbackReader``, the launcher's
    ``RunMonitor`` with its ``ForgeryReporter``. The schema kinds went in before the processes started."""
    from astraflow.infra.launch.launcher import ForgeryReporter
    from astraflow.infra.launch.monitor import RunMonitor
    from astraflow.producers.feeder.feedback import FeedbackReader
    from astraflow.producers.rollout.component import runnable_task

    config, topics = load_config(pipeline.config), pipeline.topics
    where = {"tasks": topics.tasks(), "feedback": topics.feedback()}
    where |= {"metrics": topics.metrics("stream"), "deadletter": topics.deadletter("stream")}
    for index, kind in enumerate(k for k in chosen_kinds if k.topic != "schemas"):
        good = good_record(kind.topic, f"a{index}", index, topics.run)
        value = make(kind, good, 0, codec)
        out.send(where[kind.topic], value, key_of(kind, good, value), kind)
    out.flush()
    producer = ComponentContext(config, pipeline.run_dir, "rollout")
    feeder = ComponentContext(config, pipeline.run_dir, "feed")
    launcher = ComponentContext(config, pipeline.run_dir, "launch")
    try:
        for message in read_snapshot(pipeline.log, where["tasks"]):  # RolloutProducer._runnable
            task, reason, error = runnable_task(codec, message.value, {"main": None}, config.rollout.group_size)
            if task is None:
                producer.dead_letter(message, reason, error)
        reader = FeedbackReader(feeder, _Curator())
        reader.catch_up()
        reader.close()
        monitor = RunMonitor(config, pipeline.run_dir, launcher.log, topics, report=ForgeryReporter(launcher))
        monitor.notes = deque(maxlen=100_000)  # what it rejects without a dead letter (an undecodable metric)
        deadline = time.monotonic() + 60
        monitor._consume(timeout=1.0)
        while any(monitor.consumer.lag().values()) and time.monotonic() < deadline:
            monitor._consume(timeout=1.0)
        monitor.close()
        out.notes = [note for note in monitor.notes if note.startswith("bad metric record")]
    finally:
        for ctx in (producer, feeder, launcher):
            ctx.producer.flush()
            ctx.close()


class _Curator:
    name = "none"

    def observe(self, stats: Any) -> None:
        return None

    def admit(self, prompt_id: str, candidate: int) -> bool:
        return True


def fates(pipeline: Pipeline, out: Injector) -> dict[str, dict]:
    """Per kind written: its rejections - dead letters of its record, the monitor's notes of an undecodable
    metric, a new schema store's ``rejected`` - found by (topic, offset), and whether they are right."""
    found: dict[tuple[str, int], list[str]] = {}
    for letter in pipeline.dead_letters():
        found.setdefault((letter.topic, letter.offset), []).append(letter.reason)
    for note in out.notes:
        offset = int(note.split("at offset ", 1)[1].split(":", 1)[0])
        found.setdefault((pipeline.topics.metrics("stream"), offset), []).append(note)
    with LogSchemaStore(pipeline.log) as store:
        for reason in store.rejected:
            offset = int(reason.split("]@", 1)[1].split(":", 1)[0])
            found.setdefault((SCHEMA_TOPIC, offset), []).append(reason)
    result = {}
    for name, records in out.records.items():
        kind = KIND_OF[name]
        reasons = [reason for where in records for reason in found.get(where, [])]
        if kind.verdict == "accept":
            ok = not reasons
        else:
            ok = len(reasons) == len(records) and all(kind.field in reason for reason in reasons)
        result[name] = {"rejections": len(reasons), "reason": reasons[0][:300] if reasons else "", "ok": ok}
    return result


def stalls(pipeline: Pipeline, started: float, ended: float, short: bool) -> dict[str, float]:
    """Per stage, the longest time between two of its records (from its first one); where the run fell
    short of its target, also from its last one to the end for a stage whose committed offset is still
    behind its input (by more than a transaction marker): one with nothing left to do is not stalled."""
    from astraflow.runtime.attach import decode_snapshot
    from astraflow.schemas.records import Metric

    topics = pipeline.topics
    outputs = {
        "stream": [topics.deadletter("stream"), topics.feedback(), topics.samples("main")],
        "train": [topics.deadletter("trainer"), topics.metrics("trainer")],
    }
    lag = pipeline.lag()
    found = {}
    for stage, names in outputs.items():
        times = sorted(
            message.timestamp_ms / 1000
            for topic in names
            for message, record in decode_snapshot(pipeline.log, topic)
            if not isinstance(record, Metric) or record.name == "train.version"
        )
        behind = short and lag[stage][1] - lag[stage][0] > 1
        times = [t for t in times if started <= t <= ended + 1] + ([ended] if behind else [])
        found[stage] = round(max((b - a for a, b in zip(times, times[1:])), default=0.0), 1)
    return found


def check(clean: dict, fuzzed: dict, stall_s: float) -> dict:
    """What the issue's done-when asks of one backend, with the counts and maxima behind it."""
    stalls = [s for run in (clean, fuzzed) for s in run["stalls_s"].values()]
    return {
        "kinds": len(fuzzed["kinds"]),
        "kinds_as_expected": sum(1 for k in fuzzed["kinds"].values() if k["ok"]),
        "most_restarts": max(fuzzed["restarts"].values(), default=0),
        "longest_stall_s": max(stalls, default=0.0),
        "every_kind_rejected_once_by_field": all(k["ok"] for k in fuzzed["kinds"].values()),
        "restarted_at_most_once": all(n <= 1 for n in fuzzed["restarts"].values()),
        "no_stall_over_s": stall_s,
        "no_stall": all(s <= stall_s for run in (clean, fuzzed) for s in run["stalls_s"].values()),
        "ledgers_equal": clean["ledger"] == fuzzed["ledger"] and bool(clean["ledger"]),
        "both_reached_target": all(run["versions"] >= run["target_versions"] for run in (clean, fuzzed)),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(result["backends"])
    fig, axes = plt.subplots(1, len(backends), figsize=(6 * len(backends), 4), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        by_topic: dict[str, list[int]] = {}
        for name, fate in result["backends"][backend]["fuzzed"]["kinds"].items():
            by_topic.setdefault(name.split(".", 1)[0], [0, 0])[0 if fate["ok"] else 1] += 1
        names = sorted(by_topic)
        ax.bar(names, [by_topic[n][0] for n in names], color="C2", label="as expected")
        ax.bar(names, [by_topic[n][1] for n in names], bottom=[by_topic[n][0] for n in names], color="C3", label="not")
        ax.set_xlabel("kinds: a bad one rejected once by a reason naming its field; an accept one taken")
        checks = result["backends"][backend]["checks"]
        ax.set(
            title=f"{backend}: ledgers equal {checks['ledgers_equal']}, no stall {checks['no_stall']}", ylabel="kinds"
        )
        ax.tick_params(axis="x", rotation=30)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--kinds", default="", help="comma-separated globs of kind names (default: every kind)")
    parser.add_argument("--groups", type=int, default=16, help="good trajectory groups in the recorded stream")
    parser.add_argument("--include-gaps", action="store_true", help="inject the kinds with a known gap too")
    parser.add_argument("--stall-s", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take to its versions")
    parser.add_argument("--out", type=Path, default=RESULTS / "fuzz.json")
    args = parser.parse_args()
    logging.getLogger("astraflow.runtime.schema_store").setLevel(logging.ERROR)  # each reader warns of each kind
    if args.kinds and args.out == RESULTS / "fuzz.json":
        parser.error("a run of some --kinds only is no committed result: give its own --out")
    record = begin()
    result: dict[str, Any] = {"inputs": {k: str(v) for k, v in vars(args).items()}, "backends": {}}
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        for backend in args.backends.split(","):
            broker, bootstrap = None, None
            if backend == "kafka":
                from astraflow.core.ports import free_port
                from astraflow.infra.broker.local import LocalKafkaBroker, default_home

                broker = LocalKafkaBroker(Path(tmp) / "broker", port=free_port(), jar_cache=default_home())
                broker.start(timeout=120)
                bootstrap = broker.bootstrap
            try:
                fuzz = chosen(args.kinds, args.include_gaps, backend)
                clean = one_run(Path(tmp), backend, bootstrap, None, args)
                fuzzed = one_run(Path(tmp), backend, bootstrap, fuzz, args)
            finally:
                if broker is not None:
                    broker.stop()
            checks = check(clean, fuzzed, args.stall_s)
            result["backends"][backend] = {
                "runtime": BACKENDS[backend],
                "checks": checks,
                "clean": clean,
                "fuzzed": fuzzed,
            }
            failed = {name: fate for name, fate in fuzzed["kinds"].items() if not fate["ok"]}
            print(json.dumps({"backend": backend, "failed": failed, **checks}), flush=True)
    result["left_out"] = {k.name: k.gap for k in kinds() if k.gap and not args.include_gaps}
    result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    result["provenance"] = finish(record)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(result, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
