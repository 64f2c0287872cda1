"""What ``train.checkpoint_every: 1`` costs: the math run with a checkpoint before every version
against one every 10 versions, side by side, on the embedded log.

With ``checkpoint_every: 1`` every version readers can see has its checkpoint on disk, so a trainer
crash loses nothing it published; with 10 it may lose up to 9 versions, which the restarted trainer
trains again under new version ids (``consumers/trainer/component.py``). The price is, per version, the
trainer's fencing check (a transaction of its committed offsets) and the checkpoint itself (model,
optimizer and state, fsynced). Measured on the whole path: ``astraflow run examples/math/config.yaml``
for ``--versions`` versions, each variant ``--rounds`` times, alternating which goes first; per run
the wall seconds per version from version 1 to the last (start-up and warm-up left out) and the
trainer's mean step time, from ``metrics.jsonl``.

Writes ``results/checkpoint_cost.json`` and ``results/checkpoint_cost.png``.

    .venv/bin/python benchmarks/checkpoint_cost.py [--versions 30] [--rounds 3]
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
VARIANTS = (1, 10)


def one_run(work: Path, every: int, versions: int, index: int) -> dict:
    name = f"every{every}-{index}"
    run_dir = work / name
    config = write_config_over(
        EXAMPLE,
        work / f"{name}.yaml",
        run=f"ckpt-{name}-{os.getpid()}",
        train={"checkpoint_every": every},
        eval={"every_versions": 1000},
        stop={"max_minutes": 15, "max_versions": versions, "target_accuracy": None},
    )
    started = time.monotonic()
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name}: astraflow run failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    reached: dict[int, float] = {}
    steps = []
    for metric in metrics:
        if metric["name"] == "train.version":
            reached.setdefault(int(metric["value"]), metric["wall_s"])
        elif metric["name"] == "train.step_seconds":
            steps.append(metric["value"])
    last = max(reached)
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints" / "main").glob("v*"))
    return {
        "run": name,
        "checkpoint_every": every,
        "versions": last,
        "seconds_per_version": (reached[last] - reached[1]) / (last - 1),
        "step_seconds_mean": statistics.fmean(steps),
        "checkpoints_kept": checkpoints,
        "command_seconds": time.monotonic() - started,
    }


def plot(runs: list[dict], medians: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for position, every in enumerate(VARIANTS):
        values = [run["seconds_per_version"] for run in runs if run["checkpoint_every"] == every]
        ax.scatter([position] * len(values), values, color="C0", zorder=3)
        ax.bar(position, medians[every], color="C1", alpha=0.5, label="median" if position == 0 else None)
    ratio = medians[1] / medians[10]
    ax.set_xticks(range(len(VARIANTS)), [f"checkpoint_every: {every}" for every in VARIANTS])
    ax.set(ylabel="wall seconds per version", title=f"math run, embedded log: every version / every 10 = {ratio:.3f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "checkpoint_cost.json")
    args = parser.parse_args()
    record = begin(EXAMPLE)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        for index in range(args.rounds):
            for every in VARIANTS if index % 2 == 0 else reversed(VARIANTS):
                runs.append(one_run(Path(tmp), every, args.versions, index))
                print(json.dumps(runs[-1]), flush=True)
    medians = {
        every: statistics.median(run["seconds_per_version"] for run in runs if run["checkpoint_every"] == every)
        for every in VARIANTS
    }
    result = {
        "inputs": {"versions": args.versions, "rounds": args.rounds, "example": str(EXAMPLE.relative_to(REPO))},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "median_seconds_per_version": {str(every): value for every, value in medians.items()},
        "ratio_every_1_to_every_10": medians[1] / medians[10],
        "runs": runs,
        "provenance": finish(record),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(runs, medians, args.out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
