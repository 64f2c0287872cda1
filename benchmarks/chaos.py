"""Chaos: the math run under many faults against a clean run with the same seed (issue #8).

Both runs use the Kafka backend on a local KRaft broker started here (``LocalKafkaBroker``) and the
same config (``examples/math/config.yaml``, same task seed), stopped at ``--versions`` versions
(or ``--minutes``, a safety cap). During the *fault* run ``FaultInjector`` (``astraflow/chaos/faults.py``)
SIGKILLs ``--kills-per-kind`` of each component kind (trainer, stream processor, rollout producer,
feeder, evaluator) in a shuffled order, a random 1-2 versions apart, and stops and restarts the
broker ``--broker-restarts`` times in between. Afterwards ``astraflow audit`` reconciles every
trajectory of each run.

Per run: wall time from version 1 to the last version (``training_span``: start-up is left out,
since the faults begin after it), versions per minute, final and best held-out accuracy, restarts
per component, the audit (trained, filtered, dead-lettered, pending, lost, trained twice) and the
load average when it ended. Then the differences: lost, duplicated, wall-time overhead (in all and
per fault), final accuracy difference.
Writes ``results/chaos.json`` and ``results/chaos.png`` (accuracy by version and version over
wall time, with the faults marked).

On this machine (2 shared cores) a component restart costs ~5-10 s of Python and torch start-up, and
on Kafka a killed consumer holds its partitions until its session times out (10 s), so read the
overhead per fault rather than as a property of the dataflow.

    .venv/bin/python benchmarks/chaos.py [--versions 40] [--kills-per-kind 4] [--broker-restarts 2] [--minutes 25]
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

from astraflow.config import write_config_over

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")


def write_config(path: Path, **sections: object) -> Path:
    return write_config_over(EXAMPLE, path, **sections)


def one_run(name: str, work: Path, bootstrap: str, args: argparse.Namespace, plan: list[str], broker=None) -> dict:
    """``astraflow run`` of the math example on Kafka with ``plan`` injected, then ``astraflow audit``."""
    from astraflow.chaos.faults import FaultInjector

    run_dir = work / name
    run_dir.mkdir(parents=True)
    config = write_config(
        work / f"{name}.yaml",
        run=f"chaos-{name}-{os.getpid()}",
        eval={"every_versions": 5},
        log={"backend": "kafka", "bootstrap": bootstrap},
        stop={"max_minutes": args.minutes, "max_versions": args.versions, "target_accuracy": None},
    )
    started = time.monotonic()
    with (run_dir / "launcher.out").open("wb") as out:
        launcher = subprocess.Popen(
            [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    injector = FaultInjector(run_dir, launcher, seed=args.seed, timeout_s=300)
    try:
        injector.run_schedule(plan, first_version=2, gaps=(1, 2), broker=broker, bootstrap=bootstrap)
        launcher.wait(timeout=args.minutes * 60 + 300)
    finally:
        if launcher.poll() is None:
            launcher.terminate()
            launcher.wait(timeout=120)
    if launcher.returncode != 0:
        raise RuntimeError(f"{name}: astraflow run failed: {(run_dir / 'launcher.out').read_text()[-3000:]}")
    audit = subprocess.run(
        [str(ASTRAFLOW), "audit", str(run_dir), "--json"], capture_output=True, text=True, timeout=600
    )
    text = subprocess.run([str(ASTRAFLOW), "audit", str(run_dir)], capture_output=True, text=True, timeout=600).stdout
    (run_dir / "audit.txt").write_text(text)
    report = json.loads(audit.stdout)
    [policy] = report["policies"]
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    versions_at = {}
    for m in metrics:
        if m["name"] == "train.version":
            versions_at.setdefault(int(m["value"]), m["wall_s"])
    return {
        "run": name,
        "command_seconds": time.monotonic() - started,
        "wall_seconds": summary["wall_seconds"],
        "first_version_wall_s": versions_at.get(1),
        "last_version_wall_s": versions_at.get(summary["versions"]),
        "versions": summary["versions"],
        "versions_per_minute": summary["versions"] / (summary["wall_seconds"] / 60),
        "base_accuracy": summary["base_accuracy"],
        "final_accuracy": summary["final_accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "accuracy_by_version": summary["accuracy_by_version"],
        "trajectories": summary["trajectories"],
        "restarts": summary.get("restarts", {}),
        "faults": injector.report(),
        "audit": {
            key: policy[key]
            for key in (
                "records",
                "items",
                "accounted",
                "trained",
                "filtered",
                "dead_lettered",
                "pending",
                "copies_dropped",
            )
        }
        | {"lost": len(policy["lost"]), "trained_twice": len(policy["trained_twice"]), "ok": report["ok"]},
        "audit_text": text,
        "version_wall_s": {str(v): t for v, t in sorted(versions_at.items())},
        "load_average_at_end": os.getloadavg(),
    }


def plot(clean: dict, faulty: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, prog) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run, style in ((clean, "-o"), (faulty, "-s")):
        points = sorted((int(v), a) for v, a in run["accuracy_by_version"].items())
        acc.plot(
            [v for v, _ in points],
            [a for _, a in points],
            style,
            label=f"{run['run']} (final {run['final_accuracy']:.3f})",
        )
        times = sorted((t, int(v)) for v, t in run["version_wall_s"].items())
        prog.plot(
            [t for t, _ in times],
            [v for _, v in times],
            label=f"{run['run']} (v1-{run['versions']} in {training_span(run):.0f} s)",
        )
    colours = {"train": "C3", "stream": "C4", "rollout": "C2", "feed": "C5", "evaluate": "C6", "broker": "k"}
    for kind, colour in colours.items():  # each fault at the version the run had reached when it came
        at = [
            (faulty["version_wall_s"][str(f["version"])], f["version"])
            for f in faulty["faults"]
            if f["kind"] == kind and str(f["version"]) in faulty["version_wall_s"]
        ]
        if at:
            prog.scatter(
                [t for t, _ in at],
                [v for _, v in at],
                color=colour,
                marker="X" if kind == "broker" else "v",
                s=80 if kind == "broker" else 40,
                zorder=3,
                label=f"kill -9 {kind}" if kind != "broker" else "broker restart",
            )
    acc.set(xlabel="weight version", ylabel="held-out exact match", title="accuracy: clean vs under faults")
    prog.set(
        xlabel="wall seconds since launch",
        ylabel="weight version",
        title=(
            f"{len(faulty['faults'])} faults; lost {faulty['audit']['lost']}, "
            f"trained twice {faulty['audit']['trained_twice']}"
        ),
    )
    acc.legend(fontsize=8)
    prog.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def training_span(run: dict) -> float:
    """Seconds from version 1 to the last version: the run without its start-up (torch imports,
    warm-up cache, the base evaluation), which the faults do not touch."""
    return (run["last_version_wall_s"] or 0.0) - (run["first_version_wall_s"] or 0.0)


def summarize(clean: dict, faulty: dict) -> dict:
    """The headline numbers of the two runs, and the runs themselves."""
    from astraflow.chaos.faults import KINDS

    kills = [f for f in faulty["faults"] if f["kind"] != "broker"]
    return {
        "kills": len(kills),
        "kills_by_kind": {kind: sum(f["kind"] == kind for f in kills) for kind in KINDS},
        "broker_restarts": sum(f["kind"] == "broker" for f in faulty["faults"]),
        "lost": faulty["audit"]["lost"],
        "duplicated": faulty["audit"]["trained_twice"],
        "clean_training_seconds": training_span(clean),
        "faults_training_seconds": training_span(faulty),
        "wall_overhead_seconds": training_span(faulty) - training_span(clean),
        "wall_overhead_fraction": training_span(faulty) / max(training_span(clean), 1e-9) - 1,
        "wall_overhead_seconds_per_fault": (training_span(faulty) - training_span(clean))
        / max(len(faulty["faults"]), 1),
        "final_accuracy_difference": faulty["final_accuracy"] - clean["final_accuracy"],
        "runs": {"clean": clean, "faults": faulty},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=40, help="Versions each run trains (stop.max_versions).")
    parser.add_argument(
        "--minutes",
        type=float,
        default=25.0,
        help="Wall-clock cap of each run (a safety net: the fault run must finish its schedule).",
    )
    parser.add_argument("--kills-per-kind", type=int, default=4)
    parser.add_argument("--broker-restarts", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = parser.parse_args()

    from astraflow.broker.local import LocalKafkaBroker, default_home, free_port
    from astraflow.chaos.faults import schedule

    plan = schedule(args.kills_per_kind, args.broker_restarts, args.seed)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        work = Path(tmp)
        broker = LocalKafkaBroker(work / "broker", port=free_port(), jar_cache=default_home())
        broker.start(timeout=120)
        try:
            clean = one_run("clean", work, broker.bootstrap, args, [])
            faulty = one_run("faults", work, broker.bootstrap, args, plan, broker=broker)
        finally:
            broker.stop()
    result = summarize(clean, faulty) | {
        "inputs": vars(args) | {"out": str(args.out), "schedule": plan},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(clean, faulty, args.out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    print(faulty["audit_text"])


if __name__ == "__main__":
    main()
