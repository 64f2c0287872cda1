"""Elastic and cross-region rollout, side by side (issue 9).

Part 1, **elastic pools**: the math run (``examples/math/config.yaml``, 4 task partitions) with
``astraflow run`` for ``--minutes`` each, in turn:

- ``fixed_small``: 1 rollout producer; ``fixed_large``: ``--large`` producers;
- ``autoscaled``: starts at 1, the scaler (``scaler.enabled``) moves it within 1..``--large``.

Per variant: wall time, producer-seconds (``summary.json``: every producer's wall time from start
to exit, the quantity autoscaling saves), the trainer wait fraction w (Σ ``train.wait_seconds`` /
Σ (wait + ``train.step_seconds``) over the run), final and best held-out accuracy, versions,
trajectories, the scaler's decisions. Ratios against ``fixed_large``: producer-seconds and accuracy.

Part 2, **cross-region**: the same run on the Kafka backend (a local KRaft broker), components
started one by one: trainer, stream processor, feeder and evaluator on the host, ``--producers``
rollout producers either on the host or in a ``RemoteRegion`` (a network namespace behind a
``tc tbf`` cap of ``--rate-mbit`` and the delay proxy adding ``--delay-ms`` each way;
``astraflow/chaos/netns.py``). Per placement: trajectories/s, versions, final accuracy, and the
link itself (produce round trip and bulk MB/s of a plain Kafka client in the region and on the
host). Needs root for the namespaces; skipped with the reason otherwise.

On this machine (2 cores) producers and trainer share the cores, so a bigger pool
cannot add compute: read producer-seconds and w, not wall time. ``--quick`` only checks the harness
in under a minute (the autoscaled variant for 15 s and the link probe; no cross-region run) and
writes ``elastic_quick.json``; it measures nothing. Both record their provenance (``provenance.py``).

    .venv/bin/python benchmarks/elastic.py [--quick] [--minutes 8] [--large 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from astraflow.config import write_config_over
from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")
QUICK_DEADLINE_S = 55.0


def write_config(path: Path, **sections: object) -> Path:
    return write_config_over(EXAMPLE, path, **sections)


def wait_fraction(metrics: list[dict]) -> float | None:
    waited = sum(m["value"] for m in metrics if m["name"] == "train.wait_seconds")
    stepped = sum(m["value"] for m in metrics if m["name"] == "train.step_seconds")
    return waited / (waited + stepped) if waited + stepped > 0 else None


# Part 1 ----------------------------------------------------------------------------------------


def run_pool(name: str, work: Path, minutes: float, rollout: dict, scaler: dict) -> dict:
    """One ``astraflow run`` of the math example; the numbers of the module docstring."""
    run_dir = work / name
    run_dir.mkdir(parents=True)
    config = write_config(
        run_dir.parent / f"{name}.yaml",
        run=f"elastic-{name}",
        log={"partitions": 4},
        rollout=rollout,
        scaler=scaler,
        stop={"max_minutes": minutes, "target_accuracy": None},
    )
    started = time.monotonic()
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=minutes * 60 + 900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name}: astraflow run failed: {result.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    decisions = [
        (m["wall_s"], int(m["value"]), m["labels"].get("rule", ""))
        for m in metrics
        if m["name"] == "scaler.desired_producers"
    ]
    return {
        "variant": name,
        "command_seconds": time.monotonic() - started,
        "wall_seconds": summary["wall_seconds"],
        "producer_seconds": summary["producer_seconds"],
        "trainer_wait_fraction": wait_fraction(metrics),
        "final_accuracy": summary["final_accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "base_accuracy": summary["base_accuracy"],
        "versions": summary["versions"],
        "trajectories": summary["trajectories"],
        "producers_started": len({m["labels"]["instance"] for m in metrics if m["name"] == "rollout.busy_seconds"}),
        "scaler_changes": [d for i, d in enumerate(decisions) if i == 0 or d[1] != decisions[i - 1][1]],
    }


# Part 2 ----------------------------------------------------------------------------------------


def probe(bootstrap: str, topic: str, acks: int = 8, bulk_bytes: int = 2 << 20) -> dict:
    """Produce round trips (each record flushed alone) and bulk throughput of a plain client."""
    from astraflow.log import open_log

    with open_log("kafka", bootstrap=bootstrap) as log, log.producer() as producer:
        producer.send(topic, b"warm-up")
        producer.flush()
        trips = []
        for i in range(acks):
            t0 = time.perf_counter()
            producer.send(topic, f"ack-{i}".encode())
            producer.flush()
            trips.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(bulk_bytes // (128 << 10)):
            producer.send(topic, bytes(128 << 10))
        producer.flush(timeout=300)
        seconds = time.perf_counter() - t0
    return {"round_trip_ms": 1000 * statistics.median(trips), "bulk_mb_per_s": bulk_bytes / seconds / 1e6}


def run_probe(prefix: list[str], bootstrap: str, topic: str) -> dict:
    result = subprocess.run(
        [*prefix, sys.executable, str(Path(__file__).resolve()), "--probe", bootstrap, topic],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"link probe failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_on_kafka(name: str, work: Path, bootstrap: str, minutes: float, producers: int, region) -> dict:
    """Trainer, stream, feeder, evaluator on the host; producers on the host or in ``region``."""
    from astraflow.log import TopicPartition, open_log
    from astraflow.schemas.codec import Codec
    from astraflow.schemas.records import Metric

    run = f"xr-{name}-{os.getpid()}"
    run_dir = work / name
    run_dir.mkdir(parents=True)
    config = write_config(
        work / f"{name}.yaml", run=run, log={"backend": "kafka", "bootstrap": bootstrap, "partitions": 4}
    )
    subprocess.run(
        [str(ASTRAFLOW), "warmup", str(config), "--run-dir", str(run_dir)],
        check=True,
        capture_output=True,
        timeout=1800,
    )
    (run_dir / "logs").mkdir(exist_ok=True)

    def start(component: str, tag: str, prefix: list[str], *extra: str) -> subprocess.Popen:
        out = (run_dir / "logs" / f"{tag}.out").open("wb")
        return subprocess.Popen(
            [*prefix, str(ASTRAFLOW), component, str(config), "--run-dir", str(run_dir), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    processes = [start(c, c, []) for c in ("train", "stream", "feed", "evaluate")]
    address, prefix, label = (
        (region.expose(bootstrap), region.argv([]), region.name) if region else (bootstrap, [], "local")
    )
    processes += [
        start("rollout", f"rollout-{i}", prefix, "--bootstrap", address, "--region", label) for i in range(producers)
    ]
    time.sleep(minutes * 60)
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    codec = Codec()
    metrics: list[Metric] = []
    with open_log("kafka", bootstrap=bootstrap) as log:
        trajectories = sum(log.end_offsets(f"{run}.trajectories.main").values())
        partitions = [TopicPartition(f"{run}.metrics.{role}", 0) for role in ("producer", "trainer", "evaluator")]
        ends = {p: log.end_offsets(p.topic)[0] for p in partitions}
        with log.consumer(group_id=None) as consumer:
            consumer.assign(partitions)
            consumer.seek_to_beginning()
            deadline = time.monotonic() + 120
            while any(consumer.position(p) < ends[p] for p in partitions) and time.monotonic() < deadline:
                metrics += [codec.decode(m.value, expect=Metric) for m in consumer.poll(max_records=5000, timeout=1.0)]
    produced = [m for m in metrics if m.name == "rollout.trajectories"]
    span = (
        (max(m.created_ms for m in produced) - min(m.created_ms for m in produced)) / 1000 if len(produced) > 1 else 0.0
    )
    accuracy = {m.step: m.value for m in metrics if m.name == "eval.accuracy"}
    return {
        "placement": name,
        "trajectories": trajectories,
        "trajectories_per_s": trajectories / span if span else None,
        "versions": max((int(m.value) for m in metrics if m.name == "train.version"), default=0),
        "final_accuracy": accuracy[max(accuracy)] if accuracy else None,
        "mean_version_lag": statistics.mean(m.value for m in metrics if m.name == "rollout.version_lag")
        if produced
        else None,
        "trainer_wait_fraction": wait_fraction([{"name": m.name, "value": m.value} for m in metrics]),
    }


def cross_region(work: Path, minutes: float, producers: int, rate_mbit: float, delay_ms: float, quick: bool) -> dict:
    from astraflow.chaos.netns import RemoteRegion
    from astraflow.infra.broker.local import LocalKafkaBroker, default_home, free_port
    from astraflow.log import TopicSpec, open_log

    reason = RemoteRegion.available()
    if reason is not None:
        return {"skipped": reason}
    out: dict = {"rate_mbit": rate_mbit, "delay_ms_each_way": delay_ms}
    broker = LocalKafkaBroker(work / "broker", port=free_port(), jar_cache=default_home())
    broker.start(timeout=120)
    try:
        with open_log("kafka", bootstrap=broker.bootstrap) as log:
            for topic in ("probe.local", "probe.remote"):
                log.create_topic(TopicSpec(topic))
        with RemoteRegion("remote", rate_mbit=rate_mbit, delay_ms=delay_ms) as region:
            out["link"] = {
                "local": run_probe([], broker.bootstrap, "probe.local"),
                "remote": run_probe(region.argv([]), region.expose(broker.bootstrap), "probe.remote"),
            }
        if not quick:
            out["runs"] = [run_on_kafka("local", work, broker.bootstrap, minutes, producers, None)]
            with RemoteRegion("remote", rate_mbit=rate_mbit, delay_ms=delay_ms) as region:
                out["runs"].append(run_on_kafka("remote", work, broker.bootstrap, minutes, producers, region))
            local, remote = out["runs"]
            if local["trajectories_per_s"] and remote["trajectories_per_s"]:
                out["remote_over_local_throughput"] = remote["trajectories_per_s"] / local["trajectories_per_s"]
    finally:
        broker.stop()
    return out


# Report ----------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = result["elastic"]["variants"]
    names = [v["variant"] for v in pools]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    for ax, key, label in zip(
        axes,
        ("producer_seconds", "trainer_wait_fraction", "final_accuracy"),
        ("producer-seconds", "trainer wait fraction w", "final held-out accuracy"),
    ):
        ax.bar(names, [v[key] or 0 for v in pools], color=["#888", "#444", "#2a7"][: len(names)])
        ax.set_title(label)
    link = result["cross_region"].get("link")
    ax = axes[3]
    if "runs" in result["cross_region"]:
        runs = result["cross_region"]["runs"]
        ax.bar([r["placement"] for r in runs], [r["trajectories_per_s"] or 0 for r in runs], color=["#444", "#c63"])
        ax.set_title("cross-region: trajectories/s")
    elif link:
        ax.bar(
            ["local", "remote"],
            [link["local"]["round_trip_ms"], link["remote"]["round_trip_ms"]],
            color=["#444", "#c63"],
        )
        ax.set_title("link: produce round trip (ms)")
    else:
        ax.set_title(f"cross-region skipped: {result['cross_region'].get('skipped', '')[:40]}")
    title = "AstraFlow elastic rollout" + (" (--quick: harness check, not a measurement)" if result["quick"] else "")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="check the harness in under a minute; measures nothing")
    parser.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of each run")
    parser.add_argument("--large", type=int, default=3, help="producers of the large pool (autoscaling bound)")
    parser.add_argument("--producers", type=int, default=2, help="producers of each cross-region run")
    parser.add_argument("--rate-mbit", type=float, default=20.0)
    parser.add_argument("--delay-ms", type=float, default=150.0)
    parser.add_argument("--probe", nargs=2, metavar=("BOOTSTRAP", "TOPIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(*args.probe)))
        return
    record = begin(EXAMPLE)
    started = time.monotonic()
    scaler = {
        "enabled": True,
        "min_producers": 1,
        "max_producers": args.large,
        "window_s": 60,
        "interval_s": 10,
        "cooldown_s": 60,
    }
    plan = [
        ("fixed_small", {"producers": 1}, {}),
        ("fixed_large", {"producers": args.large}, {}),
        ("autoscaled", {"producers": 1}, scaler),
    ]
    minutes = args.minutes
    if args.quick:
        plan, minutes = (
            [("autoscaled", {"producers": 1}, {**scaler, "window_s": 5, "interval_s": 2, "cooldown_s": 5})],
            0.15,
        )
    result: dict = {
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_avg": os.getloadavg(),
        },
        "inputs": {"config": str(EXAMPLE.relative_to(REPO)), "minutes": minutes, "large": args.large, "partitions": 4},
    }
    with tempfile.TemporaryDirectory(prefix="astraflow-elastic-") as tmp:
        work = Path(tmp)
        variants = [run_pool(name, work, minutes, rollout, scale) for name, rollout, scale in plan]
        result["elastic"] = {"variants": variants}
        by = {v["variant"]: v for v in variants}
        if {"fixed_large", "autoscaled"} <= set(by):
            result["elastic"]["autoscaled_over_fixed_large"] = {
                "producer_seconds": by["autoscaled"]["producer_seconds"] / by["fixed_large"]["producer_seconds"],
                "final_accuracy_delta": by["autoscaled"]["final_accuracy"] - by["fixed_large"]["final_accuracy"],
            }
        result["cross_region"] = cross_region(work, minutes, args.producers, args.rate_mbit, args.delay_ms, args.quick)
    result["seconds"] = time.monotonic() - started
    if args.quick and result["seconds"] > QUICK_DEADLINE_S:
        print(f"warning: --quick took {result['seconds']:.0f} s", file=sys.stderr)
    result["provenance"] = finish(record)
    name = "elastic_quick" if args.quick else "elastic"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    plot(result, RESULTS / f"{name}.png")
    print(json.dumps({k: result[k] for k in ("elastic", "cross_region", "seconds")}, indent=2))


if __name__ == "__main__":
    main()
