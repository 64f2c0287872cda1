"""The single-policy loop on the embedded log against the same loop on a local Kafka broker (issue #25).

``astraflow run examples/math/config.yaml`` for ``--versions`` versions on each variant, side by side,
``--rounds`` times with the order alternating:

- ``embedded``: the embedded log (its default stream runtime, native);
- ``kafka``: the local broker with Kafka's default stream runtime (faust);
- ``kafka-native``: the local broker with the native stream runtime.

Held-out evaluation is off (``eval.every_versions`` 1000, so the evaluator only scores the final
version), so what is measured is the loop itself. Per run, from ``metrics.jsonl`` and ``astraflow
stats --json``: wall seconds per version from version 1 to the last (start-up left out) and versions
per minute from it, the trainer's median wait for its next batch (``train.wait_seconds``, versions 2
on), the median optimizer step, and the version chain's p50 and mean per hop. The summary holds the
medians over rounds and the ratios of each Kafka variant to the embedded log, beside the issue's
bars: the trainer's median wait at most 1.5x the embedded log's, versions per minute at least 0.67x.

Without ``--bootstrap`` a local KRaft broker is started from the Apache Kafka jars in a temporary
directory and stopped at the end. Writes ``results/backends.json`` (with its provenance: ``provenance.py``)
and ``results/backends.png``.

    .venv/bin/python benchmarks/backends.py [--versions 60] [--rounds 2] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
VARIANTS = ("embedded", "kafka", "kafka-native")
BARS = {"wait_ratio_max": 1.5, "versions_per_minute_ratio_min": 0.67}
"""Issue #25's bars for the default Kafka runtime against the embedded log."""


def one_run(work: Path, variant: str, versions: int, index: int, bootstrap: str) -> dict:
    name = f"{variant}-{index}"
    run_dir = work / name
    log = {"backend": "embedded"} if variant == "embedded" else {"backend": "kafka", "bootstrap": bootstrap}
    stream = {"runtime": "native"} if variant == "kafka-native" else {}
    config = write_config_over(
        EXAMPLE,
        work / f"{name}.yaml",
        run=f"backends-{name}-{os.getpid()}",
        log=log,
        stream=stream,
        eval={"every_versions": 1000},
        stop={"max_minutes": 15, "max_versions": versions, "target_accuracy": None},
    )
    started = time.monotonic()
    command = [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: astraflow run failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    command_seconds = time.monotonic() - started
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    reached: dict[int, float] = {}
    waits, steps = [], []
    for metric in metrics:
        if metric["name"] == "train.version":
            reached.setdefault(int(metric["value"]), metric["wall_s"])
        elif metric["name"] == "train.wait_seconds" and metric["step"] >= 2:
            waits.append(metric["value"])
        elif metric["name"] == "train.step_seconds":
            steps.append(metric["value"])
    last = max(reached)
    seconds_per_version = (reached[last] - reached[1]) / (last - 1)
    stats_command = [str(ASTRAFLOW), "stats", str(run_dir), "--json"]
    if variant != "embedded":
        stats_command += ["--bootstrap", bootstrap]
    stats = json.loads(subprocess.run(stats_command, capture_output=True, text=True, check=True).stdout)
    chain = stats["version_chain"][0]
    return {
        "run": name,
        "variant": variant,
        "versions": last,
        "seconds_per_version": seconds_per_version,
        "versions_per_minute": 60.0 / seconds_per_version,
        "trainer_wait_median_s": statistics.median(waits),
        "step_median_s": statistics.median(steps),
        "hops": {hop["hop"]: {"p50_ms": hop["p50_ms"], "mean_ms": hop["mean_ms"]} for hop in chain["hops"]},
        "command_seconds": command_seconds,
    }


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "versions_per_minute", "versions per minute"),
        (axes[1], "trainer_wait_median_s", "trainer's median wait per version (s)"),
    ):
        for position, variant in enumerate(VARIANTS):
            values = [run[key] for run in runs if run["variant"] == variant]
            ax.scatter([position] * len(values), values, color="C0", zorder=3)
            ax.bar(position, summary["medians"][variant][key], color="C1", alpha=0.5)
        ax.set_xticks(range(len(VARIANTS)), VARIANTS)
        ax.set(ylabel=label)
    ratios = summary["kafka_over_embedded"]["kafka"]
    fig.suptitle(
        f"math loop: Kafka (faust) / embedded: versions per minute {ratios['versions_per_minute']:.2f}x, "
        f"trainer wait {ratios['trainer_wait_median_s']:.2f}x"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start a local one)")
    parser.add_argument("--out", type=Path, default=RESULTS / "backends.json")
    args = parser.parse_args()
    record = begin(EXAMPLE)
    runs = []
    with tempfile.TemporaryDirectory(prefix="backends-") as tmp:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            from astraflow.infra.broker.local import LocalKafkaBroker, default_home, free_port

            broker = LocalKafkaBroker(Path(tmp) / "broker", free_port(), jar_cache=default_home())
            broker.start()
            bootstrap = broker.bootstrap
        try:
            for index in range(args.rounds):
                for variant in VARIANTS if index % 2 == 0 else reversed(VARIANTS):
                    runs.append(one_run(Path(tmp), variant, args.versions, index, bootstrap))
                    print(json.dumps({k: v for k, v in runs[-1].items() if k != "hops"}), flush=True)
        finally:
            if broker is not None:
                broker.stop()
    keys = ("seconds_per_version", "versions_per_minute", "trainer_wait_median_s", "step_median_s")
    medians = {
        variant: {key: statistics.median(run[key] for run in runs if run["variant"] == variant) for key in keys}
        for variant in VARIANTS
    }
    ratios = {
        variant: {key: medians[variant][key] / medians["embedded"][key] for key in keys}
        for variant in VARIANTS
        if variant != "embedded"
    }
    summary = {
        "medians": medians,
        "kafka_over_embedded": ratios,
        "bars": BARS,
        "bars_met": {
            "trainer_wait": ratios["kafka"]["trainer_wait_median_s"] <= BARS["wait_ratio_max"],
            "versions_per_minute": ratios["kafka"]["versions_per_minute"] >= BARS["versions_per_minute_ratio_min"],
        },
    }
    result = {
        "inputs": {
            "versions": args.versions,
            "rounds": args.rounds,
            "example": str(EXAMPLE.relative_to(REPO)),
        },
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "summary": summary,
        "runs": runs,
        "provenance": finish(record),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(runs, summary, args.out.with_suffix(".png"))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
