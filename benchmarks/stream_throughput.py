"""Stream throughput: trajectories/s through each stream runtime on Kafka, next to a raw loop of the same bytes.

Each variant is one process reading ``--records`` trajectory records (groups of ``--group-size``
with mixed rewards, so the default pipeline accepts every group) from its own copy of the input
topic (2 partitions), written before it starts, on a local KRaft broker:

- ``raw``: confluent-kafka consume -> produce of the same bytes to a one-partition topic, polls
  of up to 512, committing as the native loop did before it was transactional (each poll once
  its copies are acknowledged, as ``Producer.mark`` told native; after a flush when idle or a
  second late): the native loop without decoding, operators, encoding and transactions, the
  ceiling of this broker and client on this machine. Unchanged since a8c69cf, so that ratios
  compare.
- ``native``: ``astraflow stream --runtime native``: decode and validate, group, staleness ->
  GRPO -> zero_variance, TrainSamples and PromptStats encoded and sent, exactly once: each poll
  (up to 512 records, fewer when it is caught up) is one Kafka transaction holding the poll's
  input offsets, its outputs (TrainSamples, PromptStats, dead letters) and its changelog records
  (``{run}.stream.{policy}.changelog``: half-filled groups, closed group ids, operator state, log
  time), committed as soon as the poll's complete groups are emitted - no timer. Its metrics go
  outside the transaction.
- ``faust``: ``astraflow stream --runtime faust``: the same operators as a faust agent; each
  record's outputs, table entries and input offset are committed together in Kafka transactions.

Rate: trajectories per second over the steady part of the run, the output records (samples;
for ``raw`` the copies) between the 10th and the 90th percentile of the times the broker
appended them (``LogAppendTime``, set on each output topic: a producer's own timestamps would
time handing records to a client that buffers them, not writing them to the log). That
leaves out each process's start (faust: joining the group and restoring its table), which is
not throughput. A second rate, ``readable_per_s``, takes the same percentiles of the times a
``read_committed`` reader got the records: what a trainer sees, faust's in bursts at each
commit. Next to them, trajectories per CPU-second of the process and the broker
(``/proc``; the broker only when this script started it), from the first output record seen to
the last: on a shared machine it moves far less with other load than the wall-clock rate does
(``None`` when the run was too short to measure its CPU time). Rounds rotate the order of the variants;
each ratio is the median of the per-round ratios, taken side by side. The first
``--warmup-rounds`` are run and reported but not counted: a fresh broker JVM gets faster over its
first tens of thousands of records (in one run raw rose 4.5k -> 19k/s over five rounds), and raw
is the variant the broker limits most. Raw still varies about 2x between rounds after that
(7.8k-20k/s in the committed run); the runtimes, limited by their own CPU, vary far less.

Commit-to-visible latency (``visible_latency_ms``, p50 / p99 / max per variant and round; the
medians over rounds in ``medians.visible_latency_ms``): for each output record, the time the
``read_committed`` reader got it minus the time the broker appended it (``LogAppendTime``; reader
and broker share this machine's clock). A transactional record becomes readable only when its
transaction commits, so for ``native`` and ``faust`` this is how long an output waits in the log,
written but invisible, for its commit, plus the reader's own delay; it does not include the
processing before the record was sent, nor time an input waited to be polled (every input is
written before a variant starts, so that would measure the backlog, not the runtime). ``raw``'s
copies are readable once appended, so its figure is the reader's delay alone: the floor of the
others. The reader keeps up: it waits for one record and then takes what has arrived (up to
1000, counted in ``reader_full_polls`` when it got 1000, i.e. records were waiting for it: in the
committed run none of native's, one of raw's, and 2-5 a round of faust's, whose commits release
records in bursts of over 1000), so a backlog would show in raw's figure too.

Targets: faust >= 30 % and native >= 50 % of raw (issues #4, #21; the raw loop as defined at
a8c69cf, unchanged), and native's commit-to-visible p99 <= 100 ms (issue #21; median over rounds
of each round's p99). Writes ``benchmarks/results/stream_throughput.json`` (with its provenance:
``provenance.py``) and ``.png``.

    .venv/bin/python benchmarks/stream_throughput.py [--bootstrap HOST:PORT] [--rounds 3] [--records 3000]
        [--variants native]   # raw always runs: the ratios need it
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import yaml

from astraflow.log import TopicSpec, open_log
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.records import Trajectory
from provenance import begin, finish

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ["raw", "native", "faust"]
TARGETS = {"faust_vs_raw": 0.3, "native_vs_raw": 0.5}
LATENCY_TARGET_MS = 100
"""Issue #21: native's commit-to-visible p99 (median over rounds) at most this."""
PARTITIONS = 2
CLIENT = {"acks": "all", "enable.idempotence": True, "message.max.bytes": 64 * 1024 * 1024, "log_level": 3}
"""The raw loop's producer settings: those of ``KafkaLog``, so the ratio measures what a runtime adds."""
CONSUMER = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "max.partition.fetch.bytes": 64 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "receive.message.max.bytes": 65 * 1024 * 1024,
    "log_level": 3,
}
"""The raw loop's consumer settings: the fetch sizes of ``KafkaLog`` (librdkafka's default of 1 MB per
partition and fetch would make raw fetch ~50 trajectories a round trip, where the runtimes fetch 64 MB)."""


def make_trajectory(
    group: int, index: int, group_size: int, response_tokens: int, rng: np.random.Generator
) -> Trajectory:
    """A realistic member of group ``group``: 256 prompt tokens, ``response_tokens`` generated ones."""
    r, gid = response_tokens, f"group-{group:06d}"
    return Trajectory(
        trajectory_id=f"{gid}/{index}",
        episode_id=f"{gid}/{index}",
        group_id=gid,
        task_id=gid,
        prompt_id=f"prompt-{group:06d}",
        policy="main",
        workflow="math",
        prompt_ids=rng.integers(0, 151_936, 256, dtype=np.int32),
        response_ids=rng.integers(0, 151_936, r, dtype=np.int32),
        behaviour_logprobs=-rng.exponential(0.5, r).astype(np.float32),
        token_versions=np.zeros(r, np.int32),
        loss_mask=np.ones(r, np.uint8),
        reward=float((group + index) % 2),
        response_text=("So the answer is 42. " * r)[: 4 * r],
        group_size=group_size,
    )


def raw_loop(bootstrap: str, source: str, target: str, records: int, done: "mp.synchronize.Event") -> None:
    """Copy ``records`` records from ``source`` to ``target``, committing as the native runtime does."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{source}.raw", **CONSUMER})
    producer = Producer({"bootstrap.servers": bootstrap, **CLIENT})
    consumer.subscribe([source])
    # one target partition, so delivery reports come in send order: a count is a mark
    acked = [0]
    pending: list[
        tuple[int, dict[int, int], float]
    ] = []  # per poll not committed: copies sent so far, offsets, when read

    def on_delivery(err: object, message: object) -> None:
        if err is not None:
            raise RuntimeError(f"raw copy not delivered: {err}")
        acked[0] += 1

    def commit(settled: int) -> None:
        offsets: dict[int, int] = {}
        for _, polled, _ in pending[:settled]:
            offsets.update(polled)
        consumer.commit(
            offsets=[TopicPartition(source, p, offset) for p, offset in offsets.items()], asynchronous=False
        )
        del pending[:settled]

    copied = 0
    while copied < records:
        first = consumer.poll(0.5)  # then what has arrived, up to 512: as the Log API polls
        batch = [first] + consumer.consume(511, timeout=0) if first is not None else []
        # commit as the native loop does: each poll once its copies are acknowledged, without waiting
        # for them unless the input is idle or the oldest offsets have waited a second
        if pending and (not batch or time.monotonic() - pending[0][2] > 1.0):
            producer.flush(30)
            commit(len(pending))
        elif pending:
            producer.poll(0)  # serve the delivery reports that have arrived
            settled = sum(1 for mark, _, _ in pending if mark <= acked[0])
            if settled:
                commit(settled)
        if not batch:
            continue
        read_at, polled = time.monotonic(), {}
        for message in batch:
            if message.error() is None:
                producer.produce(target, message.value(), message.key(), on_delivery=on_delivery)
                copied += 1
                polled[message.partition()] = message.offset() + 1
        producer.poll(0)
        pending.append((copied, polled, read_at))
    producer.flush(30)
    consumer.close()
    done.wait(120)  # until the CPU time was read: a process that exited may be reaped, and its /proc entry gone


def stamp_on_append(bootstrap: str, topic: str) -> None:
    """Make the broker stamp each record of ``topic`` when it appends it (``LogAppendTime``).

    A producer's own timestamps (``CreateTime``) tell when it handed a record to its client, which
    buffers up to a gigabyte, not when the record was written.
    """
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures resolve
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes used so far (``/proc/PID/stat``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


READER_BATCH = 1000
"""The most records the output reader takes from its client at a time."""


def follow_output(
    bootstrap: str,
    topic: str,
    records: int,
    process: subprocess.Popen | mp.process.BaseProcess,
    pids: dict[str, int],
    timeout_s: float,
) -> dict:
    """Read the ``records`` committed records of ``topic`` as they arrive. Returns their log
    append timestamps (``stamps``, ms), the times this reader got them (``arrivals``, ms, wall
    clock), how many arrived after the first poll that saw any (``counted``), the CPU seconds the
    processes in ``pids`` used from that poll to the last (``cpu``; a finished process still has
    its ``/proc`` entry until it is reaped), and how many of the reader's polls returned records
    (``polls``) and how many of those were full (``full_polls``: records were waiting for it)."""
    from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            **{
                key: CONSUMER[key]
                for key in ("max.partition.fetch.bytes", "fetch.max.bytes", "receive.message.max.bytes")
            },
            "log_level": 3,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    stamps: list[int] = []
    arrivals: list[int] = []
    polls = full_polls = 0
    first: tuple[int, dict[str, float]] | None = None
    deadline = time.monotonic() + timeout_s
    while len(stamps) < records:
        if failed(process) or time.monotonic() > deadline:
            raise RuntimeError(
                f"{topic}: {len(stamps)} of {records} records, and the process "
                f"{'failed' if failed(process) else 'timed out'}"
            )
        # wait for one record, then take what has arrived: consume(n, timeout) would hold the
        # records that arrived until it had n of them or the timeout passed
        message = consumer.poll(0.2)
        batch = [] if message is None else [message, *consumer.consume(READER_BATCH - 1, timeout=0)]
        received = int(time.time() * 1000)
        polls += bool(batch)
        full_polls += len(batch) == READER_BATCH
        for message in batch:
            if message.error() is None:
                kind, stamp = message.timestamp()
                if kind != TIMESTAMP_LOG_APPEND_TIME:
                    raise RuntimeError(f"{topic}: records are not stamped by the broker (timestamp type {kind})")
                stamps.append(stamp)
                arrivals.append(received)
        if first is None and stamps:
            first = len(stamps), {name: cpu_seconds([pid]) for name, pid in pids.items()}
    consumer.close()
    last = {name: cpu_seconds([pid]) for name, pid in pids.items()}
    return {
        "stamps": stamps,
        "arrivals": arrivals,
        "counted": records - first[0],
        "cpu": {name: last[name] - first[1][name] for name in pids},
        "polls": polls,
        "full_polls": full_polls,
    }


def failed(process: subprocess.Popen | mp.process.BaseProcess) -> bool:
    """A runtime ended before it was stopped, or the raw loop ended with an error."""
    return process.poll() is not None if isinstance(process, subprocess.Popen) else process.exitcode not in (None, 0)


def steady_rate(stamps: list[int]) -> float:
    """Records per second between the 10th and the 90th percentile of the timestamps."""
    ordered = sorted(stamps)
    low, high = len(ordered) // 10, len(ordered) * 9 // 10
    return (high - low) / max((ordered[high] - ordered[low]) / 1000, 1e-3)


def run_variant(
    variant: str,
    args: argparse.Namespace,
    bootstrap: str,
    broker_pid: int | None,
    records: list[tuple[bytes, bytes]],
    tmp: Path,
) -> dict:
    """Write the input, run one variant until all its output is readable, return its rate."""
    run = f"bench{variant}{uuid.uuid4().hex[:8]}"
    topics = RunTopics(run, "math", ("main",))
    with open_log("kafka", bootstrap=bootstrap) as log:
        topics.ensure(log, PARTITIONS)
        target = topics.samples("main") if variant != "raw" else f"{run}.copies"
        log.create_topic(TopicSpec(target, partitions=1, max_message_bytes=32 * 1024 * 1024))
        stamp_on_append(bootstrap, target)
        with log.producer() as producer:
            for key, value in records:
                producer.send(topics.trajectories("main"), value, key=key)
    started = time.monotonic()
    if variant == "raw":
        context = mp.get_context("spawn")
        done = context.Event()
        process = context.Process(
            target=raw_loop, args=(bootstrap, topics.trajectories("main"), target, len(records), done)
        )
        process.start()
    else:
        config = tmp / f"{run}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "run": run,
                    "log": {"backend": "kafka", "bootstrap": bootstrap, "partitions": PARTITIONS},
                    "rollout": {"group_size": args.group_size},  # else every trajectory fails validation
                }
            )
        )
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "astraflow.cli",
                "stream",
                str(config),
                "--run-dir",
                str(tmp / run),
                "--runtime",
                variant,
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / f"{run}.log").open("wb"),
            stdin=subprocess.DEVNULL,
        )
    pids = {"process": process.pid, **({"broker": broker_pid} if broker_pid else {})}
    try:
        read = follow_output(bootstrap, target, len(records), process, pids, args.timeout)
    finally:
        if isinstance(process, subprocess.Popen):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        else:
            done.set()
            process.join(timeout=60)
    stamps, arrivals, counted, cpu = read["stamps"], read["arrivals"], read["counted"], read["cpu"]
    rate = steady_rate(stamps)
    latencies = np.subtract(arrivals, stamps)
    return {
        "trajectories_per_s": rate,
        "mb_per_s": rate * args.trajectory_bytes / 1e6,
        "readable_per_s": steady_rate(arrivals),
        "trajectories_per_cpu_s": counted / sum(cpu.values()) if counted and sum(cpu.values()) > 0.05 else None,
        "visible_latency_ms": {
            "p50": float(np.percentile(latencies, 50)),
            "p99": float(np.percentile(latencies, 99)),
            "max": float(latencies.max()),
        },
        "reader_polls": read["polls"],
        "reader_full_polls": read["full_polls"],
        "cpu_s": cpu,
        "cpu_counted_trajectories": counted,
        "wall_s": round(time.monotonic() - started, 1),
    }


def summarize(rounds: list[dict[str, dict]]) -> tuple[dict, dict]:
    """Median rates, and the ratios to raw: per round (side by side), then their median."""

    def median(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return statistics.median(known) if known else None

    keys = (("trajectories_per_s", ""), ("trajectories_per_cpu_s", "_per_cpu_s"), ("readable_per_s", "_readable"))
    variants = [v for v in VARIANTS if v in rounds[0]]
    medians: dict = {key: {v: median([r[v].get(key) for r in rounds]) for v in variants} for key, _ in keys}
    medians["visible_latency_ms"] = {
        v: {q: median([r[v]["visible_latency_ms"][q] for r in rounds]) for q in ("p50", "p99")} for v in variants
    }
    ratios = {}
    for variant in [v for v in variants if v != "raw"]:
        for key, name in keys:
            per_round = [
                r[variant][key] / r["raw"][key] if r[variant].get(key) and r["raw"].get(key) else None for r in rounds
            ]
            ratios[f"{variant}_vs_raw{name}"] = median(per_round)
            ratios[f"{variant}_vs_raw{name}_per_round"] = per_round
    return medians, ratios


def plot(path: Path, rounds: list[dict], medians: dict, ratios: dict, caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in VARIANTS if v in rounds[0]]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    panels = [
        ("trajectories_per_s", "", "trajectories / s (steady part)"),
        ("trajectories_per_cpu_s", "_per_cpu_s", "trajectories / CPU-second (process + broker)"),
    ]
    colors = {"raw": "#999999", "native": "#4c72b0", "faust": "#dd8452"}
    names = {"raw": "raw consume->produce", "native": "native runtime", "faust": "faust runtime"}
    xs = range(len(variants))
    for ax, (key, suffix, label) in zip(axes, panels):
        ax.bar(xs, [medians[key][v] or 0.0 for v in variants], color=[colors[v] for v in variants], alpha=0.8)
        for x, variant in zip(xs, variants):
            measured = [r[variant][key] for r in rounds if r[variant][key] is not None]
            ax.scatter([x] * len(measured), measured, color="black", s=12, zorder=3)
            if variant != "raw" and ratios[f"{variant}_vs_raw{suffix}"] is not None:
                ax.annotate(
                    f"{ratios[f'{variant}_vs_raw{suffix}']:.0%} of raw\n(target {TARGETS[f'{variant}_vs_raw']:.0%})",
                    (x, medians[key][variant]),
                    ha="center",
                    va="bottom",
                    fontsize=9,
                    xytext=(0, 4),
                    textcoords="offset points",
                )
                ax.axhline(TARGETS[f"{variant}_vs_raw"] * medians[key]["raw"], color=colors[variant], ls=":", lw=1)
        ax.set_xticks(list(xs), [names[v] for v in variants])
        ax.set_ylabel(f"{label}; dots: rounds", fontsize=9)
    ax = axes[2]
    width = 0.38
    for offset, quantile, alpha in ((-width / 2, "p50", 0.45), (width / 2, "p99", 0.9)):
        ax.bar(
            [x + offset for x in xs],
            [medians["visible_latency_ms"][v][quantile] for v in variants],
            width,
            color=[colors[v] for v in variants],
            alpha=alpha,
        )
        for x, variant in zip(xs, variants):
            measured = [r[variant]["visible_latency_ms"][quantile] for r in rounds]
            ax.scatter([x + offset] * len(measured), measured, color="black", s=10, zorder=3)
            ax.annotate(
                f"{quantile}\n{medians['visible_latency_ms'][variant][quantile]:.0f}",
                (x + offset, max(r[variant]["visible_latency_ms"][quantile] for r in rounds)),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
    ax.axhline(LATENCY_TARGET_MS, color=colors["native"], ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(top=4 * max(r[v]["visible_latency_ms"]["p99"] for r in rounds for v in variants))  # room for labels
    ax.set_xticks(list(xs), [names[v] for v in variants])
    ax.set_ylabel("append -> read by a read_committed reader (ms); dots: rounds", fontsize=9)
    ax.set_title(f"commit-to-visible p50 | p99 (dotted: native's p99 target, {LATENCY_TARGET_MS} ms)", fontsize=9)
    fig.suptitle(
        "Stream runtimes on Kafka vs a raw loop of the same bytes (ratios: median of per-round ratios)",
        fontsize=11,
    )
    fig.text(0.5, 0.01, caption, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="use this Kafka broker instead of starting a local one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup-rounds", type=int, default=2, help="rounds run first and not counted: the broker's JVM warms up"
    )
    parser.add_argument("--records", type=int, default=3000, help="trajectories per variant and round")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--response-tokens", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=300, help="seconds one variant may take")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset to run (raw always runs: the ratios)"
    )
    args = parser.parse_args()
    record = begin()  # no config file: the workload is the arguments, in the command
    variants = [v for v in VARIANTS if v in {"raw", *args.variants.split(",")}]

    from astraflow.schemas.codec import Codec

    codec, rng = Codec(), np.random.default_rng(0)
    groups = args.records // args.group_size
    records = [
        (f"group-{g:06d}".encode(), codec.encode(make_trajectory(g, i, args.group_size, args.response_tokens, rng)))
        for g in range(groups)
        for i in range(args.group_size)
    ]
    args.trajectory_bytes = round(statistics.mean(len(value) for _, value in records))
    load_at_start, started = os.getloadavg()[0], time.monotonic()
    rounds: list[dict[str, dict]] = []
    warmups: list[dict[str, dict]] = []  # reported, not counted
    with tempfile.TemporaryDirectory(prefix="astraflow-stream-bench-") as tmp:
        broker = None
        if not args.bootstrap:
            from astraflow.infra.broker.local import LocalKafkaBroker, default_home, free_port

            broker = LocalKafkaBroker(Path(tmp) / "kafka", free_port(), jar_cache=default_home())
            broker.start(timeout=120)
        try:
            bootstrap = args.bootstrap or broker.bootstrap
            broker_pid = None if broker is None else broker.status().pid
            for index in range(-args.warmup_rounds, args.rounds):
                order = variants[index % len(variants) :] + variants[: index % len(variants)]
                result = {
                    variant: run_variant(variant, args, bootstrap, broker_pid, records, Path(tmp)) for variant in order
                }
                (warmups if index < 0 else rounds).append(result)
                print(
                    f"{'warm-up' if index < 0 else 'round'} {index}: "
                    + "  ".join(
                        f"{v} {result[v]['trajectories_per_s']:,.0f}/s "
                        f"({result[v]['trajectories_per_cpu_s'] or 0:,.0f}/CPU-s, "
                        f"visible p50 {result[v]['visible_latency_ms']['p50']:.0f} "
                        f"p99 {result[v]['visible_latency_ms']['p99']:.0f} ms)"
                        for v in variants
                    ),
                    flush=True,
                )
        finally:
            if broker is not None:
                broker.stop()
    medians, ratios = summarize(rounds)
    met = {name: ratios[name] >= target for name, target in TARGETS.items() if name in ratios}
    if "native" in variants:
        met["native_visible_p99_ms"] = medians["visible_latency_ms"]["native"]["p99"] <= LATENCY_TARGET_MS
    machine = {
        "nproc": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1m_at_start": load_at_start,
        "loadavg_1m_at_end": os.getloadavg()[0],
    }
    caption = (
        f"{args.records} trajectories of {args.trajectory_bytes:,} B, groups of {args.group_size}, "
        f"{args.rounds} rounds after {args.warmup_rounds} warm-up; "
        f"{machine['nproc']} CPUs, 1-min load {load_at_start:.1f} at start, {machine['loadavg_1m_at_end']:.1f} at end"
    )
    report = {
        "benchmark": "stream_throughput",
        "inputs": {
            **vars(args),
            "out": str(args.out),
            "partitions": PARTITIONS,
            "raw_producer": CLIENT,
            "broker": "given" if args.bootstrap else "local KRaft (astraflow.infra.broker.local)",
        },
        "machine": machine,
        "targets": {**TARGETS, "native_visible_p99_ms": LATENCY_TARGET_MS},
        "medians": medians,
        "ratios": ratios,
        "targets_met": met,
        "rounds": rounds,
        "warmup_rounds": warmups,
        "wall_s": round(time.monotonic() - started, 1),
        "provenance": finish(record),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stream_throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(args.out / "stream_throughput.png", rounds, medians, ratios, caption)
    print(json.dumps({"medians": medians, "ratios": ratios, "targets_met": met, "wall_s": report["wall_s"]}, indent=2))


if __name__ == "__main__":
    main()
