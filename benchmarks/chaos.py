"""Chaos: the math run under many faults against a clean run of the same length, in three setups.

Setups (``--setups``, each a clean run and a fault run with the same config and task seed):

- ``kafka-faust``: Kafka backend, the ``faust`` stream runtime;
- ``kafka-native``: Kafka backend, the ``native`` stream runtime;
- ``embedded-native``: the embedded log, the ``native`` stream runtime.

A Kafka setup runs on its own three-node local cluster (``LocalKafkaCluster``: three replicas of
every partition, two in sync before a write is acknowledged), started fresh for the setup.

Both runs of a setup are ``astraflow run`` of ``examples/math/config.yaml``, stopped at
``--versions`` versions (``--minutes`` is a safety cap), evaluated every ``--eval-every`` versions
on ``--heldout`` held-out problems (more than the example's 200, so one evaluation varies by ~0.015
rather than ~0.035). During the fault run ``FaultInjector`` (``astraflow/chaos/faults.py``) SIGKILLs
``--kills-per-kind`` of each component kind (trainer, stream processor, rollout producer, feeder,
evaluator) in a shuffled order, a random 1-2 versions apart; on Kafka it also restarts a broker
node ``--broker-restarts`` times and, later, SIGKILLs one node for good (``--broker-kills``): the
rest of the run has two nodes. Afterwards ``astraflow audit`` reconciles every trajectory of each
run from the records alone (trajectories, samples, the trainer's ledger, dead letters).

Per run: wall time from version 1 to the last version (``training_span``: start-up is left out,
since the faults begin after it), final held-out accuracy (the evaluation of the last version) and
the mean of the last two evaluations, restarts per component, the audit (trained, filtered,
dead-lettered, pending, lost, trained twice, trainer epochs, versions lost in crashes). Per setup:
lost, trained twice, accuracy difference against the clean run (target: the means of the last two
evaluations within 0.05), wall-time overhead per fault. Writes ``results/chaos.json`` and
``results/chaos.png`` (per setup: accuracy by version, and version over wall time with the faults
marked).

On this machine (2 shared cores) a component restart costs ~5-10 s of Python and torch start-up,
and on Kafka a killed consumer holds its partitions until its session times out (10 s), so read the
overhead per fault rather than as a property of the dataflow.

    .venv/bin/python benchmarks/chaos.py [--setups kafka-faust,kafka-native,embedded-native] [--versions 150]
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
from astraflow.core.ports import free_port
from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")
SETUPS = {
    "kafka-faust": ("kafka", "faust"),
    "kafka-native": ("kafka", "native"),
    "embedded-native": ("embedded", "native"),
}
"""Setup name → (log backend, stream runtime)."""
ACCURACY_TOLERANCE = 0.05
"""The fault run's final held-out accuracy must be within this of the clean run's. Final: the mean of
the last two evaluations (``--eval-every`` versions apart), since the policy itself moves by a few
points between neighbouring versions, more than one evaluation on 1000 problems varies."""


def one_run(name: str, work: Path, setup: str, args: argparse.Namespace, plan: list[str], cluster=None) -> dict:
    """``astraflow run`` of the math example with ``plan`` injected, then ``astraflow audit``."""
    from astraflow.chaos.faults import FaultInjector

    backend, runtime = SETUPS[setup]
    run_dir = work / setup / name
    run_dir.mkdir(parents=True)
    log = {"backend": "kafka", "bootstrap": cluster.bootstrap} if backend == "kafka" else {"backend": "embedded"}
    config = write_config_over(
        EXAMPLE,
        work / setup / f"{name}.yaml",
        run=f"chaos-{setup}-{name}-{os.getpid()}",
        task={"heldout_size": args.heldout},
        eval={"every_versions": args.eval_every},
        log=log,
        stream={"runtime": runtime},
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
        injector.run_schedule(plan, first_version=2, gaps=(1, 2), brokers=cluster.nodes if cluster else [])
        launcher.wait(timeout=args.minutes * 60 + 300)
    finally:
        if launcher.poll() is None:
            launcher.terminate()
            launcher.wait(timeout=120)
    if launcher.returncode != 0:
        raise RuntimeError(f"{setup}/{name}: astraflow run failed: {(run_dir / 'launcher.out').read_text()[-3000:]}")
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
    accuracy = sorted((int(v), a) for v, a in summary["accuracy_by_version"].items())
    return {
        "run": name,
        "command_seconds": time.monotonic() - started,
        "wall_seconds": summary["wall_seconds"],
        "first_version_wall_s": versions_at.get(1),
        "last_version_wall_s": versions_at.get(summary["versions"]),
        "versions": summary["versions"],
        "base_accuracy": summary["base_accuracy"],
        "final_accuracy": summary["final_accuracy"],
        "final_version_evaluated": accuracy[-1][0] if accuracy else None,
        "last_two_mean_accuracy": sum(a for _, a in accuracy[-2:]) / len(accuracy[-2:]) if accuracy else None,
        "accuracy_by_version": summary["accuracy_by_version"],
        "trajectories": summary["trajectories"],
        "restarts": summary.get("restarts", {}),
        "faults": injector.report(),
        "audit": {
            key: policy.get(key)
            for key in (
                "records",
                "items",
                "accounted",
                "trained",
                "filtered",
                "dead_lettered",
                "pending",
                "copies_dropped",
                "epochs",
                "lost_versions",
                "retrained",
            )
        }
        | {"lost": len(policy["lost"]), "trained_twice": len(policy["trained_twice"]), "ok": report["ok"]},
        "audit_text": text,
        "version_wall_s": {str(v): t for v, t in sorted(versions_at.items())},
        "load_average_at_end": os.getloadavg(),
    }


def training_span(run: dict) -> float:
    """Seconds from version 1 to the last version: the run without its start-up (torch imports,
    warm-up cache, the base evaluation), which the faults do not touch."""
    return (run["last_version_wall_s"] or 0.0) - (run["first_version_wall_s"] or 0.0)


def summarize(clean: dict, faulty: dict) -> dict:
    """The headline numbers of one setup's two runs, and the runs themselves."""
    from astraflow.chaos.faults import BROKER_FAULTS, KINDS

    kills = [f for f in faulty["faults"] if f["kind"] not in BROKER_FAULTS]
    difference = faulty["final_accuracy"] - clean["final_accuracy"]
    return {
        "kills": len(kills),
        "kills_by_kind": {kind: sum(f["kind"] == kind for f in kills) for kind in KINDS},
        "broker_restarts": sum(f["kind"] == "broker" for f in faulty["faults"]),
        "brokers_killed_for_good": sum(f["kind"] == "broker-kill" for f in faulty["faults"]),
        "lost": faulty["audit"]["lost"],
        "trained_twice": faulty["audit"]["trained_twice"],
        "clean_lost": clean["audit"]["lost"],
        "clean_trained_twice": clean["audit"]["trained_twice"],
        "clean_final_accuracy": clean["final_accuracy"],
        "faults_final_accuracy": faulty["final_accuracy"],
        "final_accuracy_difference": difference,
        "last_two_mean_difference": faulty["last_two_mean_accuracy"] - clean["last_two_mean_accuracy"],
        "accuracy_within_tolerance": abs(faulty["last_two_mean_accuracy"] - clean["last_two_mean_accuracy"])
        <= ACCURACY_TOLERANCE,
        "clean_training_seconds": training_span(clean),
        "faults_training_seconds": training_span(faulty),
        "wall_overhead_fraction": training_span(faulty) / max(training_span(clean), 1e-9) - 1,
        "wall_overhead_seconds_per_fault": (training_span(faulty) - training_span(clean))
        / max(len(faulty["faults"]), 1),
        "runs": {"clean": clean, "faults": faulty},
    }


def plot(setups: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(setups), 2, figsize=(13, 4.2 * len(setups)), squeeze=False)
    colours = {
        "train": "C3",
        "stream": "C4",
        "rollout": "C2",
        "feed": "C5",
        "evaluate": "C6",
        "broker": "k",
        "broker-kill": "C1",
    }
    labels = {"broker": "broker node restart", "broker-kill": "broker node killed for good"}
    for (setup, result), (acc, prog) in zip(setups.items(), axes):
        clean, faulty = result["runs"]["clean"], result["runs"]["faults"]
        for run, style in ((clean, "-o"), (faulty, "-s")):
            points = sorted((int(v), a) for v, a in run["accuracy_by_version"].items())
            acc.plot(
                [v for v, _ in points],
                [a for _, a in points],
                style,
                markersize=3,
                label=f"{run['run']} (final {run['final_accuracy']:.3f})",
            )
            times = sorted((t, int(v)) for v, t in run["version_wall_s"].items())
            prog.plot(
                [t for t, _ in times],
                [v for _, v in times],
                label=f"{run['run']} (v1-{run['versions']} in {training_span(run):.0f} s)",
            )
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
                    marker="X" if kind in labels else "v",
                    s=80 if kind in labels else 40,
                    zorder=3,
                    label=labels.get(kind, f"kill -9 {kind}"),
                )
        acc.set(
            xlabel="weight version",
            ylabel="held-out exact match",
            title=f"{setup}: accuracy, clean vs under faults (difference {result['final_accuracy_difference']:+.3f})",
        )
        prog.set(
            xlabel="wall seconds since launch",
            ylabel="weight version",
            title=(
                f"{setup}: {len(faulty['faults'])} faults; lost {result['lost']}, "
                f"trained twice {result['trained_twice']}"
            ),
        )
        acc.legend(fontsize=8)
        prog.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_setup(setup: str, work: Path, args: argparse.Namespace) -> dict:
    """The clean run and the fault run of ``setup``; on Kafka each on a fresh three-node cluster."""
    from astraflow.chaos.faults import schedule
    from astraflow.infra.broker.cluster import LocalKafkaCluster
    from astraflow.infra.broker.local import default_home

    kafka = SETUPS[setup][0] == "kafka"
    plan = schedule(
        args.kills_per_kind,
        args.broker_restarts if kafka else 0,
        args.seed,
        broker_kills=args.broker_kills if kafka else 0,
    )
    runs = {}
    for name, faults in (("clean", []), ("faults", plan)):
        cluster = None
        if kafka:
            cluster = LocalKafkaCluster(
                work / setup / f"cluster-{name}", 3, free_port(span=3), jar_cache=default_home()
            )
            cluster.start(timeout=180)
        try:
            print(f"{setup}: {name} run ({len(faults)} faults)", flush=True)
            runs[name] = one_run(name, work, setup, args, faults, cluster)
        finally:
            if cluster is not None:
                cluster.stop()
    return summarize(runs["clean"], runs["faults"]) | {"schedule": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"Comma-separated, of {', '.join(SETUPS)}.")
    parser.add_argument("--versions", type=int, default=150, help="Versions each run trains (stop.max_versions).")
    parser.add_argument(
        "--minutes",
        type=float,
        default=40.0,
        help="Wall-clock cap of each run (a safety net: the fault run must finish its schedule).",
    )
    parser.add_argument("--kills-per-kind", type=int, default=4)
    parser.add_argument("--broker-restarts", type=int, default=2, help="Broker node restarts (Kafka setups).")
    parser.add_argument("--broker-kills", type=int, default=1, help="Broker nodes killed for good (Kafka setups).")
    parser.add_argument("--heldout", type=int, default=1000, help="Held-out problems per evaluation.")
    parser.add_argument("--eval-every", type=int, default=10, help="Versions between evaluations.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the run directories here.")
    args = parser.parse_args()
    setups = [name for name in args.setups.split(",") if name]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        parser.error(f"unknown setups {unknown}; choose of {sorted(SETUPS)}")

    record = begin(EXAMPLE)
    results = {}
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        work = args.keep or Path(tmp)
        for setup in setups:
            results[setup] = run_setup(setup, work, args)
            print(json.dumps({k: v for k, v in results[setup].items() if k != "runs"}, indent=2), flush=True)
    result = {
        "setups": results,
        "ok": all(
            r["lost"] == 0 and r["trained_twice"] == 0 and r["accuracy_within_tolerance"] for r in results.values()
        ),
        "inputs": vars(args) | {"out": str(args.out), "keep": str(args.keep) if args.keep else None},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "provenance": finish(record),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(results, args.out.with_suffix(".png"))
    for setup, r in results.items():
        print(r["runs"]["faults"]["audit_text"])


if __name__ == "__main__":
    main()
