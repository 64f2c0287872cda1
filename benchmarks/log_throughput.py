"""Log throughput: Avro trajectories through each log backend, side by side with raw Kafka bytes.

Variants, each run as a consumer process (attached first) and a producer process:

- ``raw_kafka``: confluent-kafka ``Producer``/``Consumer`` moving pre-made bytes the size of an
  encoded Trajectory: the ceiling of this broker and client on this machine.
- ``avro_kafka``: ``Codec.encode`` -> ``KafkaLog`` producer -> ``KafkaLog`` consumer -> ``Codec.decode``.
- ``avro_embedded``: the same through ``EmbeddedLog`` (SQLite WAL).
- ``small_embedded``: ~200 B Avro ``Metric`` records through ``EmbeddedLog``.

Each round runs every variant twice, in a rotated order:

1. *throughput*: the producer sends ``N`` records as fast as it can, flushing every
   ``--flush-every`` (a rollout producer acknowledges its trajectories in batches); rate =
   records / (first send -> last record consumed). Latency here is under saturation.
2. *latency*: ``--paced`` records at ``--rate`` records/s, each flushed on its own; latency =
   consume time - send time, carried in a header (``time.monotonic_ns``, one clock per machine).

Each throughput phase also records the CPU seconds of the producer, the consumer and (for Kafka)
the broker JVM: bytes per CPU-second barely move with other load on a shared machine, where
wall-clock rates do.

Targets (from the issue): avro_kafka >= 50% of raw_kafka bytes/s; small_embedded >= 20,000
records/s. Writes ``benchmarks/results/log_throughput.json`` (with its provenance: ``provenance.py``)
and ``.png``.

    .venv/bin/python benchmarks/log_throughput.py [--bootstrap HOST:PORT] [--rounds 5]

Without ``--bootstrap`` a local KRaft broker is started from the Apache Kafka jars
(``astraflow.infra.broker.local.LocalKafkaBroker``) in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import socket
import sqlite3
import statistics
import struct
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from astraflow.log import TopicPartition, TopicSpec, open_log
from astraflow.schemas.records import Metric, Trajectory, Turn
from provenance import begin, finish

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ["raw_kafka", "avro_kafka", "avro_embedded", "small_embedded"]
TRAJECTORY_VARIANTS = VARIANTS[:3]
SEND_HEADER = "bench_send_ns"
MAX_MESSAGE_BYTES = 1024 * 1024
CLIENT_BYTES = 64 * 1024 * 1024
RAW_PRODUCER = {"acks": "all", "enable.idempotence": True, "message.max.bytes": CLIENT_BYTES, "log_level": 3}
RAW_CONSUMER = {
    "max.partition.fetch.bytes": CLIENT_BYTES,
    "fetch.max.bytes": CLIENT_BYTES,
    "receive.message.max.bytes": CLIENT_BYTES + 1024 * 1024,
    "log_level": 3,
}
"""The librdkafka settings ``KafkaLog`` uses (durability and sizes), so that the ratio measures
what AstraFlow adds to raw bytes: the Avro codec and the Log API's Python layer."""


def make_trajectory(response_tokens: int = 1024, prompt_tokens: int = 256) -> Trajectory:
    """A trajectory of realistic size: token ids, log-probs, versions, mask, text and turns."""
    rng = np.random.default_rng(0)
    r = response_tokens
    return Trajectory(
        trajectory_id="traj-00000000",
        episode_id="episode-00000000",
        group_id="group-00000000",
        task_id="task-00000000",
        prompt_id="gsm8k-00000000",
        policy="solver",
        workflow="math",
        prompt_ids=rng.integers(0, 151_936, prompt_tokens, dtype=np.int32),
        response_ids=rng.integers(0, 151_936, r, dtype=np.int32),
        behaviour_logprobs=-rng.exponential(0.5, r).astype(np.float32),
        token_versions=np.full(r, 41, np.int32),
        loss_mask=np.ones(r, np.uint8),
        reward=1.0,
        reward_components={"correct": 1.0, "format": 0.2},
        turns=[Turn("assistant", 0, r, 41)],
        response_text=("So the answer is 42. " * r)[: 4 * r],
        finish_reason="length",
        group_size=8,
        producer_id="rollout-0",
        region="eu-west-1",
        hardware="cpu",
        generate_ms=1234.5,
        reward_ms=1.5,
        created_ms=1_700_000_000_000,
    )


def make_metric() -> Metric:
    """A small record (~200 B encoded), like the metrics every component emits."""
    labels = {
        "run": "main",
        "policy": "solver",
        "workflow": "math",
        "region": "eu-west-1",
        "host": "node-07.cluster.local",
        "engine": "torch",
        "model": "Qwen2.5-0.5B-Instruct",
    }
    return Metric(
        component="rollout-0",
        name="rollout/generated_tokens_per_second",
        value=1234.5,
        step=0,
        created_ms=1_700_000_000_000,
        labels=labels,
    )


# ---------------------------------------------------------------------------------------------
# The two ends of each variant. Raw Kafka uses confluent-kafka directly; the others the Log API.


class RawKafkaProducer:
    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self.failed: list[str] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, **RAW_PRODUCER})

    def _delivered(self, err: object, msg: object) -> None:
        if err is not None:
            self.failed.append(str(err))

    def send(self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> None:
        while True:
            try:
                self.producer.produce(topic, value, key, headers=headers, on_delivery=self._delivered)
                break
            except BufferError:
                self.producer.poll(0.01)
        self.producer.poll(0)

    def flush(self) -> None:
        if self.producer.flush(30) or self.failed:
            raise RuntimeError(f"raw kafka delivery failed: {self.failed[:3]}")

    def close(self) -> None:
        self.flush()


class RawKafkaConsumer:
    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer
        from confluent_kafka import TopicPartition as KafkaPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **RAW_CONSUMER,
            }
        )
        self.consumer.assign([KafkaPartition(topic, 0, OFFSET_BEGINNING)])

    def poll(self) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        # consume(n, t) waits for all n records or t; wait for the first only, like the Log API.
        first = self.consumer.poll(0.1)
        out = []
        for msg in [] if first is None else [first, *self.consumer.consume(499, 0)]:
            if msg.error() is not None:
                raise RuntimeError(f"raw kafka consume failed: {msg.error()}")
            out.append((msg.value(), msg.headers() or []))
        return out

    def close(self) -> None:
        self.consumer.close()


class LogProducer:
    def __init__(self, target: dict[str, str]) -> None:
        self.log = open_log(**target)
        self.producer = self.log.producer()

    def send(self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> None:
        self.producer.send(topic, value, key=key, headers=headers)

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()
        self.log.close()


class LogConsumer:
    def __init__(self, target: dict[str, str], topic: str) -> None:
        self.log = open_log(**target)
        self.consumer = self.log.consumer()
        self.consumer.assign([TopicPartition(topic, 0)])
        self.consumer.seek_to_beginning()

    def poll(self) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        return [(m.value, list(m.headers)) for m in self.consumer.poll(500, 0.1)]

    def close(self) -> None:
        self.consumer.close()
        self.log.close()


def log_target(spec: dict) -> dict[str, str]:
    if spec["variant"].endswith("kafka"):
        return {"backend": "kafka", "bootstrap": spec["bootstrap"]}
    return {"backend": "embedded", "path": spec["db"]}


def open_producer(spec: dict) -> RawKafkaProducer | LogProducer:
    if spec["variant"] == "raw_kafka":
        return RawKafkaProducer(spec["bootstrap"])
    return LogProducer(log_target(spec))


def open_consumer(spec: dict) -> RawKafkaConsumer | LogConsumer:
    if spec["variant"] == "raw_kafka":
        return RawKafkaConsumer(spec["bootstrap"], spec["topic"])
    return LogConsumer(log_target(spec), spec["topic"])


def payloads(spec: dict) -> Iterator[bytes]:
    """The values to send, one per record; the Avro variants encode inside the timed loop."""
    if spec["variant"] == "raw_kafka":
        blob = os.urandom(spec["record_bytes"])
        while True:
            yield blob
    from astraflow.schemas.codec import Codec

    codec = Codec()
    if spec["variant"] == "small_embedded":
        metric = make_metric()
        for step in range(1 << 62):
            metric.step = step
            yield codec.encode(metric)
    trajectory = make_trajectory(spec["response_tokens"])
    for i in range(1 << 62):
        trajectory.trajectory_id = f"traj-{i % 100_000_000:08d}"
        yield codec.encode(trajectory)


# ---------------------------------------------------------------------------------------------
# Worker processes. Each reports one dict on the results queue, or its traceback.


def consumer_worker(spec: dict, results: mp.Queue) -> None:
    try:
        decode = None
        if spec["variant"] != "raw_kafka":
            from astraflow.schemas.codec import Codec

            decode = Codec().decode
        consumer = open_consumer(spec)
        consumer.poll()  # the first poll joins the partition; nothing has been sent yet
        results.put({"role": "ready"})
        count, nbytes, latencies, last_ns, cpu_start = 0, 0, [], 0, None
        deadline = time.monotonic() + spec["timeout_s"]
        while count < spec["records"] and time.monotonic() < deadline:
            batch = consumer.poll()
            now = time.monotonic_ns()
            if batch and cpu_start is None:
                cpu_start = time.process_time()
            for value, headers in batch:
                if decode is not None:
                    decode(value)
                sent = dict(headers)[SEND_HEADER]
                latencies.append(now - struct.unpack("<q", sent)[0])
                nbytes += len(value)
            count += len(batch)
            if batch:
                last_ns = time.monotonic_ns()
        cpu_s = time.process_time() - (cpu_start or 0.0)
        consumer.close()
        lat_ms = np.asarray(latencies, dtype=np.float64) / 1e6
        results.put(
            {
                "role": "consumer",
                "count": count,
                "bytes": nbytes,
                "last_ns": last_ns,
                "cpu_s": cpu_s,
                "p50_ms": float(np.percentile(lat_ms, 50)) if count else None,
                "p99_ms": float(np.percentile(lat_ms, 99)) if count else None,
            }
        )
    except Exception:
        results.put({"role": "consumer", "error": traceback.format_exc()})


def producer_worker(spec: dict, results: mp.Queue) -> None:
    try:
        producer = open_producer(spec)
        values = payloads(spec)
        next(values)  # build the record (and warm the codec) before the clock starts
        key, n, flush_every = b"group-00000000", spec["records"], spec["flush_every"]
        # Connect, get an idempotent producer id, open the database: all before the clock starts.
        producer.send(spec["warmup_topic"], b"warmup", key, [(SEND_HEADER, struct.pack("<q", 0))])
        producer.flush()
        interval_ns = int(1e9 / spec["rate"]) if spec["rate"] else 0
        first_ns, cpu_start = time.monotonic_ns(), time.process_time()
        for i in range(n):
            if interval_ns:
                while time.monotonic_ns() < first_ns + i * interval_ns:
                    time.sleep(0.0002)
            value = next(values)
            producer.send(spec["topic"], value, key, [(SEND_HEADER, struct.pack("<q", time.monotonic_ns()))])
            if (i + 1) % flush_every == 0:
                producer.flush()
        producer.flush()
        flushed_ns, cpu_s = time.monotonic_ns(), time.process_time() - cpu_start
        producer.close()
        results.put({"role": "producer", "first_ns": first_ns, "flushed_ns": flushed_ns, "cpu_s": cpu_s})
    except Exception:
        results.put({"role": "producer", "error": traceback.format_exc()})


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (the broker's JVM); 0 when it is not ours."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(ctx: mp.context.BaseContext, spec: dict) -> dict:
    """Consumer first (attached and polling), then the producer; returns rates, latencies, CPU."""
    broker_pid = spec["broker_pid"] if spec["variant"].endswith("kafka") else None
    results = ctx.Queue()
    workers = [ctx.Process(target=consumer_worker, args=(spec, results))]
    workers[0].start()
    reports: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + spec["timeout_s"] + 60
        while len(reports) < 3:
            try:
                report = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{spec['variant']}: workers timed out; got {sorted(reports)}") from None
            if "error" in report:
                raise RuntimeError(f"{spec['variant']} {report['role']} failed:\n{report['error']}")
            reports[report["role"]] = report
            if report["role"] == "ready":
                broker_cpu = cpu_seconds(broker_pid)
                workers.append(ctx.Process(target=producer_worker, args=(spec, results)))
                workers[1].start()
        broker_cpu = cpu_seconds(broker_pid) - broker_cpu
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    consumed, produced = reports["consumer"], reports["producer"]
    if consumed["count"] != spec["records"]:
        raise RuntimeError(f"{spec['variant']}: consumed {consumed['count']} of {spec['records']} records")
    seconds = (consumed["last_ns"] - produced["first_ns"]) / 1e9
    cpu = {"producer": produced["cpu_s"], "consumer": consumed["cpu_s"], "broker": broker_cpu}
    return {
        "records": spec["records"],
        "seconds": seconds,
        "records_per_s": spec["records"] / seconds,
        "mb_per_s": consumed["bytes"] / seconds / 1e6,
        "producer_records_per_s": spec["records"] / ((produced["flushed_ns"] - produced["first_ns"]) / 1e9),
        "p50_ms": consumed["p50_ms"],
        "p99_ms": consumed["p99_ms"],
        "cpu_s": cpu,
        "mb_per_cpu_s": consumed["bytes"] / sum(cpu.values()) / 1e6,
        "records_per_cpu_s": spec["records"] / sum(cpu.values()),
    }


# ---------------------------------------------------------------------------------------------
# Topics, the broker, and the run.


def create_topics(spec: dict) -> None:
    """The phase's topic, and the warm-up topic its producer writes one record to first."""
    names = [spec["topic"], spec["warmup_topic"]]
    if spec["variant"] == "raw_kafka":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": spec["bootstrap"], "log_level": 3})
        config = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        existing = admin.list_topics(timeout=30).topics
        futures = admin.create_topics([NewTopic(name, 1, 1, config=config) for name in names if name not in existing])
        for future in futures.values():
            future.result(30)
        return
    with open_log(**log_target(spec)) as log:
        for name in names:
            log.create_topic(TopicSpec(name, partitions=1, max_message_bytes=MAX_MESSAGE_BYTES))


def delete_kafka_topics(bootstrap: str, names: list[str]) -> None:
    """Remove the benchmark's topics from a broker we were given (the broker deletes files later)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.delete_topics(names).values():
        future.result(30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def machine_info() -> dict:
    from importlib import metadata

    import confluent_kafka
    import fastavro

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "platform": platform.platform(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "fastavro": fastavro.__version__,
        "confluent_kafka": metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "sqlite": sqlite3.sqlite_version,
        "loadavg_1m_at_end": os.getloadavg()[0],
    }


def median_of(rounds: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def summarize(runs: dict[str, dict[str, list[dict]]], targets: dict) -> tuple[dict, dict, dict]:
    """Medians per variant, the ratios the targets are about, and whether the targets are met.

    Rates per CPU-second (producer + consumer + broker processes) are reported next to the
    wall-clock rates: on a shared machine they move far less with what else is running.
    """
    medians = {
        variant: {
            "records_per_s": median_of(phases["throughput"], "records_per_s"),
            "mb_per_s": median_of(phases["throughput"], "mb_per_s"),
            "producer_records_per_s": median_of(phases["throughput"], "producer_records_per_s"),
            "saturated_p50_ms": median_of(phases["throughput"], "p50_ms"),
            "saturated_p99_ms": median_of(phases["throughput"], "p99_ms"),
            "paced_p50_ms": median_of(phases["latency"], "p50_ms"),
            "paced_p99_ms": median_of(phases["latency"], "p99_ms"),
            "mb_per_cpu_s": median_of(phases["throughput"], "mb_per_cpu_s"),
            "records_per_cpu_s": median_of(phases["throughput"], "records_per_cpu_s"),
        }
        for variant, phases in runs.items()
    }
    raw = medians["raw_kafka"]["mb_per_s"]
    per_round = [
        avro["mb_per_s"] / plain["mb_per_s"]
        for avro, plain in zip(runs["avro_kafka"]["throughput"], runs["raw_kafka"]["throughput"])
    ]
    ratios = {
        "avro_kafka_vs_raw_kafka_bytes_per_s": medians["avro_kafka"]["mb_per_s"] / raw,
        "avro_kafka_vs_raw_kafka_bytes_per_s_per_round": per_round,
        "avro_kafka_vs_raw_kafka_bytes_per_cpu_s": medians["avro_kafka"]["mb_per_cpu_s"]
        / medians["raw_kafka"]["mb_per_cpu_s"],
        "avro_embedded_vs_raw_kafka_bytes_per_s": medians["avro_embedded"]["mb_per_s"] / raw,
        "avro_kafka_vs_raw_kafka_p50_latency": medians["avro_kafka"]["paced_p50_ms"]
        / medians["raw_kafka"]["paced_p50_ms"],
    }
    kafka_ratio, small_rate = ratios["avro_kafka_vs_raw_kafka_bytes_per_s"], medians["small_embedded"]["records_per_s"]
    met = {
        "avro_kafka_ge_50pct_raw_kafka_bytes_per_s": kafka_ratio >= targets["avro_kafka_vs_raw"],
        "small_embedded_ge_20k_records_per_s": small_rate >= targets["small_embedded_records_per_s"],
    }
    return medians, ratios, met


def plot(path: Path, runs: dict, medians: dict, ratios: dict, targets: dict, sizes: dict, caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ((ax_mb, ax_cpu), (ax_rec, ax_lat)) = plt.subplots(2, 2, figsize=(14, 10))
    colors = {"raw_kafka": "#7f7f7f", "avro_kafka": "#1f77b4", "avro_embedded": "#2ca02c", "small_embedded": "#98df8a"}
    plain = FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}")
    labels = [v.replace("_", "\n") for v in VARIANTS]

    xs = range(len(TRAJECTORY_VARIANTS))
    heights = [medians[v]["mb_per_s"] for v in TRAJECTORY_VARIANTS]
    ax_mb.bar(xs, heights, color=[colors[v] for v in TRAJECTORY_VARIANTS])
    for x, v in zip(xs, TRAJECTORY_VARIANTS):
        ax_mb.plot([x] * len(runs[v]["throughput"]), [r["mb_per_s"] for r in runs[v]["throughput"]], "k.", ms=5)
        highest = max(r["mb_per_s"] for r in runs[v]["throughput"])
        ax_mb.text(x, highest, f"median {medians[v]['mb_per_s']:.0f}", ha="center", va="bottom", fontsize=9)
    ax_mb.axhline(
        targets["avro_kafka_vs_raw"] * medians["raw_kafka"]["mb_per_s"],
        ls="--",
        c="r",
        lw=1,
        label=f"target for avro_kafka: {targets['avro_kafka_vs_raw']:.0%} of raw_kafka",
    )
    top = max(max(r["mb_per_s"] for r in runs[v]["throughput"]) for v in TRAJECTORY_VARIANTS)
    ax_mb.set_ylim(0, 1.3 * top)
    ax_mb.set_xticks(list(xs), labels[: len(TRAJECTORY_VARIANTS)])
    ax_mb.set_ylabel("MB/s, first send -> last consume (bar: median, dots: rounds)")
    ax_mb.set_title(
        f"1,024-token trajectories, {sizes['trajectory_bytes'] / 1e3:.1f} kB each\n"
        f"avro_kafka / raw_kafka = {ratios['avro_kafka_vs_raw_kafka_bytes_per_s']:.2f}"
    )
    ax_mb.legend(loc="upper left", fontsize=8)

    xs = range(len(TRAJECTORY_VARIANTS))
    bottom = [0.0] * len(TRAJECTORY_VARIANTS)
    for part, hatch in (("producer", ""), ("consumer", "//"), ("broker", "..")):
        seconds = [
            statistics.median(r["cpu_s"][part] * 1e6 / r["records"] for r in runs[v]["throughput"])
            for v in TRAJECTORY_VARIANTS
        ]
        ax_cpu.bar(
            xs,
            seconds,
            bottom=bottom,
            color=[colors[v] for v in TRAJECTORY_VARIANTS],
            hatch=hatch,
            edgecolor="k",
            lw=0.5,
            label=part,
        )
        bottom = [b + x for b, x in zip(bottom, seconds)]
    for x, v in zip(xs, TRAJECTORY_VARIANTS):
        ax_cpu.text(x, bottom[x], f"{medians[v]['mb_per_cpu_s']:.0f} MB/CPU-s", ha="center", va="bottom", fontsize=9)
    ax_cpu.set_ylim(0, 1.2 * max(bottom))
    ax_cpu.set_xticks(list(xs), labels[: len(TRAJECTORY_VARIANTS)])
    ax_cpu.set_ylabel("CPU microseconds per trajectory (median of rounds)")
    ax_cpu.set_title(
        f"CPU cost per trajectory: producer (plain), consumer (//), broker (..)\n"
        f"avro_kafka / raw_kafka bytes per CPU-s = {ratios['avro_kafka_vs_raw_kafka_bytes_per_cpu_s']:.2f}"
    )

    xs = range(len(VARIANTS))
    ax_rec.bar(xs, [medians[v]["records_per_s"] for v in VARIANTS], color=[colors[v] for v in VARIANTS])
    for x, v in zip(xs, VARIANTS):
        ax_rec.text(
            x, medians[v]["records_per_s"], f"{medians[v]['records_per_s']:,.0f}", ha="center", va="bottom", fontsize=9
        )
    ax_rec.axhline(
        targets["small_embedded_records_per_s"], ls="--", c="r", lw=1, label="target for small_embedded: 20,000/s"
    )
    ax_rec.set_yscale("log")
    ax_rec.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_rec.yaxis.set_minor_formatter(NullFormatter())
    rates = [medians[v]["records_per_s"] for v in VARIANTS]
    ax_rec.set_ylim(min(rates) / 3, 3 * max(targets["small_embedded_records_per_s"], *rates))
    ax_rec.yaxis.set_major_formatter(plain)
    ax_rec.set_xticks(list(xs), labels)
    ax_rec.set_ylabel("records/s, first send -> last consume (median, log)")
    ax_rec.set_title(f"records/s (small_embedded: {sizes['small_bytes']} B Avro Metric records)")
    ax_rec.legend(loc="upper left", fontsize=8)

    width = 0.38
    for offset, key, alpha in ((-width / 2, "paced_p50_ms", 1.0), (width / 2, "paced_p99_ms", 0.5)):
        ax_lat.bar(
            [x + offset for x in xs],
            [medians[v][key] for v in VARIANTS],
            width,
            color=[colors[v] for v in VARIANTS],
            alpha=alpha,
            edgecolor="k",
            lw=0.5,
        )
        for x, v in zip(xs, VARIANTS):
            ax_lat.text(x + offset, medians[v][key], f"{medians[v][key]:.1f}", ha="center", va="bottom", fontsize=8)
    ax_lat.set_yscale("log")
    ax_lat.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_lat.yaxis.set_major_formatter(plain)
    ax_lat.yaxis.set_minor_formatter(NullFormatter())
    ax_lat.set_xticks(list(xs), labels)
    ax_lat.set_ylabel("send -> consume latency, ms (median of rounds, log)")
    ax_lat.set_title(f"latency at {sizes['rate']} records/s, each flushed\nleft bar p50, right bar p99")
    fig.suptitle(
        f"AstraFlow log: Avro records through each backend vs raw confluent-kafka bytes of the same size\n{caption}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def start_broker(home: Path):
    """A throwaway KRaft broker in ``home``, its jars from the shared cache (fetched once)."""
    from astraflow.infra.broker.local import LocalKafkaBroker, default_home

    broker = LocalKafkaBroker(home, free_port(), jar_cache=default_home())
    broker.start()
    return broker


def phase_spec(args: argparse.Namespace, where: dict, variant: str, phase: str, label: str) -> dict:
    """Everything a producer and consumer process need to run one phase of one variant.

    ``where``: ``tmp`` (a directory for SQLite files), ``bootstrap`` and ``broker_pid`` (or None).
    """
    topic = f"bench.{variant}.{phase}.{label}.{uuid.uuid4().hex[:6]}"
    records = {
        "throughput": args.small_records if variant == "small_embedded" else args.records,
        "latency": args.paced,
        "warmup": args.warmup_records,
    }[phase]
    return {
        "variant": variant,
        "topic": topic,
        "warmup_topic": "bench.warmup",
        "bootstrap": where["bootstrap"],
        "broker_pid": where["broker_pid"],
        "db": str(Path(where["tmp"]) / f"{topic}.sqlite"),
        "response_tokens": args.response_tokens,
        "record_bytes": args.trajectory_bytes,
        "timeout_s": 120,
        "records": records,
        "flush_every": 1 if phase == "latency" else args.flush_every,
        "rate": args.rate if phase == "latency" else 0,
    }


def run_rounds(args: argparse.Namespace, where: dict) -> dict[str, dict[str, list[dict]]]:
    """One unrecorded warm-up phase per variant (JIT, page cache), then the rounds, rotated."""
    ctx = mp.get_context("spawn")
    runs: dict[str, dict[str, list[dict]]] = {v: {"throughput": [], "latency": []} for v in VARIANTS}
    plan = [(variant, "warmup", "w") for variant in VARIANTS]
    for rnd in range(args.rounds):
        order = VARIANTS[rnd % len(VARIANTS) :] + VARIANTS[: rnd % len(VARIANTS)]
        plan += [(variant, phase, f"r{rnd}") for variant in order for phase in ("throughput", "latency")]
    kafka_topics = []
    for variant, phase, label in plan:
        spec = phase_spec(args, where, variant, phase, label)
        create_topics(spec)
        result = run_phase(ctx, spec)
        if variant.endswith("kafka"):
            kafka_topics.append(spec["topic"])
        if phase != "warmup":
            runs[variant][phase].append(result)
        print(
            f"{label:3s} {variant:15s} {phase:10s} {result['records_per_s']:>10,.0f} rec/s "
            f"{result['mb_per_s']:>8.1f} MB/s"
            f"  p50 {result['p50_ms']:8.2f} ms  p99 {result['p99_ms']:8.2f} ms",
            flush=True,
        )
    if args.bootstrap:  # a broker of our own goes away with its directory; deleting mid-run would add noise
        delete_kafka_topics(args.bootstrap, [*kafka_topics, "bench.warmup"])
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="use this Kafka broker instead of starting a local one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=3000, help="trajectories per throughput phase")
    parser.add_argument("--small-records", type=int, default=40000, help="small records per throughput phase")
    parser.add_argument("--warmup-records", type=int, default=1000, help="records of the unrecorded warm-up phase")
    parser.add_argument("--response-tokens", type=int, default=1024)
    parser.add_argument("--flush-every", type=int, default=1000)
    parser.add_argument("--paced", type=int, default=200, help="records per latency phase")
    parser.add_argument("--rate", type=int, default=200, help="records/s in the latency phase")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    record = begin()  # no config file: the workload is the arguments, in the command

    from astraflow.schemas.codec import Codec

    codec = Codec()
    args.trajectory_bytes = len(codec.encode(make_trajectory(args.response_tokens)))
    sizes = {
        "trajectory_bytes": args.trajectory_bytes,
        "small_bytes": len(codec.encode(make_metric())),
        "rate": args.rate,
    }
    targets = {"avro_kafka_vs_raw": 0.5, "small_embedded_records_per_s": 20_000}
    started, load_at_start = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="astraflow-bench-") as tmp:
        broker = None if args.bootstrap else start_broker(Path(tmp) / "kafka")
        try:
            where = {
                "tmp": tmp,
                "bootstrap": args.bootstrap or broker.bootstrap,
                "broker_pid": None if broker is None else broker.status().pid,
            }
            runs = run_rounds(args, where)
        finally:
            if broker is not None:
                broker.stop()
    medians, ratios, met = summarize(runs, targets)
    machine = {**machine_info(), "loadavg_1m_at_start": load_at_start}
    caption = (
        f"{machine['nproc']} CPUs ({machine['cpu']}), 1-min load average {load_at_start:.1f} at start, "
        f"{machine['loadavg_1m_at_end']:.1f} at end; {args.rounds} rounds"
    )
    report = {
        "benchmark": "log_throughput",
        "inputs": {
            **vars(args),
            "out": str(args.out),
            **sizes,
            "raw_kafka_producer": RAW_PRODUCER,
            "raw_kafka_consumer": RAW_CONSUMER,
            "broker": "given" if args.bootstrap else "local KRaft (astraflow.infra.broker.local)",
        },
        "machine": machine,
        "targets": targets,
        "medians": medians,
        "ratios": ratios,
        "targets_met": met,
        "rounds": runs,
        "wall_s": round(time.monotonic() - started, 1),
        "provenance": finish(record),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "log_throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(args.out / "log_throughput.png", runs, medians, ratios, targets, sizes, caption)
    print(json.dumps({"ratios": ratios, "targets_met": met, "wall_s": report["wall_s"]}, indent=2))


if __name__ == "__main__":
    main()
