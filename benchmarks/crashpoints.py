"""Crash points walked: every named crash point of every stage, killed there, on every setup.

For each setup (``--setups``) and each point (``core/crashpoints.py``, found from the code; ``--stages``
keeps the points whose name starts with one of the given prefixes, to shard the walk), one ``astraflow
run`` of the math example to ``--versions`` with the point armed to fire once on its ``--pass``-th pass
(not the first: by then the stage has state to lose), through ``chaos/crash_runs.py``; for the trainer's
points (``trainer.``, ``checkpoint.``, ``seal.``, ``publish.``) also twice in a row at the same point and
once at it and once at the next. Runs sign their weights (so the checkpoint seals are written) and
checkpoint every ``--checkpoint-every`` versions (so the checkpoint points are reached early).

Setups: ``embedded-native`` (the embedded log), ``kafka-native`` and ``kafka-faust`` (a local one-node
broker each). A point that does not run on a setup (``faust.`` off the faust runtime, ``stream.`` on it,
``embedded.`` on Kafka, the system evaluator's outside ``solver_verifier``, a sharded checkpoint with one
rank) is listed as not applicable; one that applies but did not fire in its run is ``unreached`` and
counts against the walk, as a problem does.

Per run, from the records alone (``check``): trajectories lost, trained twice, trainer fall-backs behind
a committed checkpoint, version numbers naming two weights, the version target reached.

    .venv/bin/python benchmarks/crashpoints.py [--setups embedded-native,kafka-native,kafka-faust]
        [--stages trainer,checkpoint] [--out results/crashpoints-SHARD.json]
    .venv/bin/python benchmarks/crashpoints.py --merge results/crashpoints-*.json

writes ``results/crashpoints.json`` (or ``--out``) and, on ``--merge``, ``results/crashpoints.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from astraflow.chaos.crash_runs import EXAMPLE, armed_run
from astraflow.core.crashpoints import crash_point_names
from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SETUPS = ("embedded-native", "kafka-native", "kafka-faust")
TRAINER_STAGES = ("trainer.", "checkpoint.", "seal.", "publish.")


def applicable(point: str, setup: str) -> str | None:
    """Why ``point`` does not run on ``setup`` (``None``: it does)."""
    backend, runtime = setup.split("-")
    if point.startswith("faust.") and runtime != "faust":
        return "faust runtime only"
    if point.startswith("stream.") and runtime != "native":
        return "native runtime only"
    if point.startswith("embedded.") and backend != "embedded":
        return "embedded log only"
    if point.startswith("system_evaluator."):
        return "solver_verifier only"
    if point == "trainer.sharded_checkpoint_commit":
        return "a trainer of several ranks only"
    return None


def plans(points: list[str], setup: str, passes: int) -> list[tuple[str, list[str]]]:
    """(label, entries) of every run of ``setup``: each point once; a trainer's also in pairs."""
    runs = []
    for index, point in enumerate(points):
        if applicable(point, setup):
            continue
        runs.append((point, [f"{point}#{passes}"]))
        if point.startswith(TRAINER_STAGES):
            runs.append((f"{point} twice", [f"{point}#{passes}", f"{point}#{passes}"]))
            following = next((p for p in points[index + 1 :] if p.startswith(TRAINER_STAGES)), None)
            if following and not applicable(following, setup):
                runs.append((f"{point} then {following}", [f"{point}#{passes}", f"{following}#{passes}"]))
    return runs


def walk(setup: str, points: list[str], args: argparse.Namespace, work: Path) -> dict:
    """Every run of ``setup``; a Kafka setup on a broker of its own."""
    from astraflow.weights.signing import generate_key_pair

    private, public, _ = generate_key_pair(work / f"{setup}-keys")
    overrides = {
        "weights": {"signing_key": str(private), "verify_key": str(public)},
        "train": {"checkpoint_every": args.checkpoint_every},
    }
    broker = None
    if setup.startswith("kafka"):
        from astraflow.infra.broker.local import LocalKafkaBroker, default_home, free_port

        broker = LocalKafkaBroker(work / f"{setup}-broker", port=free_port(), jar_cache=default_home())
        broker.start(timeout=120)
    runs = []
    try:
        for label, entries in plans(points, setup, args.passes):
            print(f"{setup}: {label}", flush=True)
            result = armed_run(
                work / setup,
                f"run{len(runs)}",
                entries,
                setup=setup,
                bootstrap=broker.bootstrap if broker else None,
                versions=args.versions,
                minutes=args.minutes,
                overrides=overrides,
            )
            runs.append({"label": label, **result.to_dict()})
            print(f"  {result.problems or 'ok'}{' (unreached)' if result.unreached else ''}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    skipped = {point: applicable(point, setup) for point in points if applicable(point, setup)}
    failed = [run["label"] for run in runs if run["problems"] or run["unreached"]]
    return {"runs": runs, "not_applicable": skipped, "failed": failed}


def merge(paths: list[Path]) -> dict:
    """The shards' setups and runs as one result (a later shard's run of the same label replaces one)."""
    merged: dict = {"setups": {}, "shards": []}
    for path in paths:
        shard = json.loads(path.read_text())
        merged["shards"].append({"file": path.name, "provenance": shard.get("provenance")})
        for setup, found in shard["setups"].items():
            target = merged["setups"].setdefault(setup, {"runs": [], "not_applicable": {}, "failed": []})
            kept = {run["label"]: run for run in target["runs"]}
            kept.update({run["label"]: run for run in found["runs"]})
            target["runs"] = list(kept.values())
            target["not_applicable"].update(found["not_applicable"])
            target["failed"] = [label for label, run in kept.items() if run["problems"] or run["unreached"]]
    merged["points"] = sorted({name for name, _, _ in crash_point_names()})
    return merged


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = list(result["setups"])
    kinds = ("held", "failed", "not applicable")
    counts = {
        kind: [
            (
                sum(1 for run in result["setups"][s]["runs"] if not (run["problems"] or run["unreached"]))
                if kind == "held"
                else len(result["setups"][s]["failed"])
                if kind == "failed"
                else len(result["setups"][s]["not_applicable"])
            )
            for s in setups
        ]
        for kind in kinds
    }
    figure, axis = plt.subplots(figsize=(7, 3.5))
    bottom = [0] * len(setups)
    for kind, colour in zip(kinds, ("tab:green", "tab:red", "tab:gray")):
        axis.bar(setups, counts[kind], bottom=bottom, label=kind, color=colour)
        bottom = [b + c for b, c in zip(bottom, counts[kind])]
    axis.set_ylabel("runs (points, pairs)")
    axis.set_title(f"crash points walked ({len(result['points'])} points)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--stages", default="", help="comma-separated prefixes of the point names to walk")
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--passes", type=int, default=2, help="kill on this pass of the point")
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "crashpoints.json")
    parser.add_argument("--merge", type=Path, nargs="*", help="merge these shard results into --out")
    args = parser.parse_args()
    if args.merge:
        result = merge(args.merge)
        args.out.write_text(json.dumps(result, indent=2))
        plot(result, args.out.with_suffix(".png"))
        return
    record = begin(EXAMPLE)
    prefixes = tuple(p for p in args.stages.split(",") if p)
    points = sorted({name for name, _, _ in crash_point_names() if not prefixes or name.startswith(prefixes)})
    print(f"{len(points)} crash points to walk", flush=True)
    with tempfile.TemporaryDirectory(prefix="crashpoints-") as tmp:
        work = Path(tmp)
        setups = {setup: walk(setup, points, args, work) for setup in args.setups.split(",")}
    result = {
        "inputs": {**vars(args), "out": str(args.out), "merge": None, "points": points},
        "setups": setups,
        "provenance": finish(record),
        "load_average_at_end": os.getloadavg(),
    }
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({setup: found["failed"] for setup, found in setups.items()}, indent=2))


if __name__ == "__main__":
    main()
