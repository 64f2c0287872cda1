"""Data algorithms on the math task: rollouts and wall time to a held-out accuracy (issue #4).

Each arm is the math example (``examples/math/config.yaml``, same seed, embedded log, lockstep)
with only ``stream`` changed, run by ``astraflow run`` until the evaluator's greedy held-out
accuracy reaches ``--target`` (or ``--minutes`` pass):

- ``vanilla``: GRPO, every group trained, zero-variance groups included (their advantages are 0);
- ``dynamic``: dynamic sampling (DAPO): zero-variance groups dropped, the batch filled with others;
- ``dynamic+replay``: and 30% of each batch replayed from the 64 latest accepted groups;
- ``dynamic+greso``: and the feeder's GRESO curator skips prompts whose recent groups all had the
  same reward (with probability 1 − p^streak);
- ``dynamic+replay+greso``: both.

Rollouts are the trajectories the producer generated (``rollout.trajectories``) by the time of
the evaluation that first reached the target; wall time is the launcher's clock at that
evaluation, warm-up included (it is the same for every arm). The paper's claim to check: replay
and GRESO reach the same accuracy with fewer rollouts.

Writes ``results/data_algorithms.json`` and ``results/data_algorithms.png`` (accuracy against
rollouts and against wall time). Each arm records its own provenance (``provenance.py``: commit,
command, config and lock hashes, load), since ``--merge`` keeps arms of earlier invocations beside
it; the report records the invocation's.

    .venv/bin/python benchmarks/data_algorithms.py [--target 0.85] [--minutes 15] [--arms vanilla,dynamic,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")

GRPO = [{"op": "staleness"}, {"op": "grpo"}]
DYNAMIC = [*GRPO, {"op": "zero_variance"}]
REPLAY = [*DYNAMIC, {"op": "replay", "ratio": 0.3, "capacity": 64, "selector": "latest"}]
GRESO = {"type": "greso"}
ARMS: dict[str, dict] = {
    "vanilla": {"pipeline": GRPO},
    "dynamic": {"pipeline": DYNAMIC},
    "dynamic+replay": {"pipeline": REPLAY},
    "dynamic+greso": {"pipeline": DYNAMIC, "curator": GRESO},
    "dynamic+replay+greso": {"pipeline": REPLAY, "curator": GRESO},
}


def arm_config(path: Path, name: str, stream: dict, args: argparse.Namespace) -> Path:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["run"] = f"data-{name.replace('+', '-')}"
    base_stream = {
        key: value for key, value in raw.get("stream", {}).items() if key not in ("advantage", "drop_zero_variance")
    }
    raw["stream"] = base_stream | stream
    raw["stop"] = {"max_minutes": args.minutes, "target_accuracy": args.target}
    raw["eval"] = {**raw.get("eval", {}), "every_versions": args.eval_every}
    path.write_text(yaml.safe_dump(raw))
    return path


def run_arm(name: str, stream: dict, work: Path, args: argparse.Namespace) -> dict:
    run_dir = work / name.replace("+", "-")
    config = arm_config(work / f"{run_dir.name}.yaml", name, stream, args)
    record = begin(EXAMPLE)
    started = time.monotonic()
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=args.minutes * 60 + 600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name}: astraflow run failed: {result.stdout[-2000:]}{result.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    produced = sorted((m["wall_s"], m["value"]) for m in metrics if m["name"] == "rollout.trajectories")
    submitted = sorted((m["wall_s"], m["value"]) for m in metrics if m["name"] == "feeder.submitted")
    evals = sorted((m["wall_s"], m["step"], m["value"]) for m in metrics if m["name"] == "eval.accuracy")

    def latest(series: list[tuple[float, float]], wall: float) -> float:
        return max((value for at, value in series if at <= wall), default=0.0)

    curve = [
        {
            "wall_s": wall,
            "version": int(version),
            "accuracy": accuracy,
            "rollouts": int(latest(produced, wall)),
            "prompts_submitted": int(latest(submitted, wall)),
        }
        for wall, version, accuracy in evals
    ]
    reached = next((point for point in curve if point["accuracy"] >= args.target), None)
    return {
        "arm": name,
        "stream": stream,
        "command_seconds": time.monotonic() - started,
        "wall_seconds": summary["wall_seconds"],
        "warmup_seconds": summary.get("warmup_seconds"),
        "versions": summary["versions"],
        "trajectories": summary["trajectories"],
        "base_accuracy": summary["base_accuracy"],
        "final_accuracy": summary["final_accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "reached_target": reached is not None,
        "to_target": reached,
        "curve": curve,
        "load_average_at_end": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "provenance": finish(record),
    }


def plot(arms: list[dict], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_rollouts, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in arms:
        xs = [p["rollouts"] / 1000 for p in arm["curve"]]
        ys = [p["accuracy"] for p in arm["curve"]]
        by_rollouts.plot(xs, ys, marker=".", label=arm["arm"])
        by_time.plot([p["wall_s"] / 60 for p in arm["curve"]], ys, marker=".", label=arm["arm"])
    for ax, label in ((by_rollouts, "rollouts generated (thousands)"), (by_time, "wall time (min, warm-up included)")):
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.grid(alpha=0.3)
    by_rollouts.legend(fontsize=8)
    fig.suptitle(f"Data algorithms on the math task: to {target:.2f} held-out accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--minutes", type=float, default=15.0, help="cap per arm")
    parser.add_argument("--eval-every", type=int, default=5, help="versions between evaluations")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--merge", action="store_true", help="replace only these arms in an existing data_algorithms.json"
    )
    args = parser.parse_args()
    names = [name.strip() for name in args.arms.split(",") if name.strip()]
    unknown = sorted(set(names) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    record = begin(EXAMPLE)
    arms = []
    with tempfile.TemporaryDirectory(prefix="astraflow-data-") as tmp:
        for name in names:
            print(f"[data_algorithms] {name} ...", flush=True)
            arm = run_arm(name, ARMS[name], Path(tmp), args)
            to = arm["to_target"]
            print(
                f"[data_algorithms] {name}: "
                + (
                    f"{args.target} at version {to['version']}, {to['rollouts']} rollouts, {to['wall_s']:.0f} s"
                    if to
                    else f"not reached in {args.minutes} min (best {arm['best_accuracy']:.3f})"
                ),
                flush=True,
            )
            arms.append(arm)
    previous = args.out / "data_algorithms.json"
    if args.merge and previous.is_file():
        rerun = {arm["arm"] for arm in arms}
        kept = [arm for arm in json.loads(previous.read_text())["arms"] if arm["arm"] not in rerun]
        arms = sorted(kept + arms, key=lambda arm: list(ARMS).index(arm["arm"]))
    base = next((arm for arm in arms if arm["arm"] == "vanilla" and arm["reached_target"]), None)
    table = []
    for arm in arms:
        to = arm["to_target"]
        row = {
            "arm": arm["arm"],
            "reached": arm["reached_target"],
            "versions": to and to["version"],
            "rollouts": to and to["rollouts"],
            "wall_s": to and to["wall_s"],
            "best_accuracy": arm["best_accuracy"],
        }
        if base and to:
            row["rollouts_vs_vanilla"] = to["rollouts"] / base["to_target"]["rollouts"]
            row["wall_vs_vanilla"] = to["wall_s"] / base["to_target"]["wall_s"]
        table.append(row)
    report = {
        "benchmark": "data_algorithms",
        "target_accuracy": args.target,
        "inputs": {
            "example": str(EXAMPLE.relative_to(REPO)),
            "minutes_cap": args.minutes,
            "eval_every": args.eval_every,
        },
        "machine": {"nproc": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "table": table,
        "arms": arms,
        "provenance": finish(record),
    }
    (args.out / "data_algorithms.json").write_text(json.dumps(report, indent=1))
    plot(arms, args.target, args.out / "data_algorithms.png")
    for row in table:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
