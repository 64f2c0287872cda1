"""Crash points walked: every named crash point of every stage, killed there, on every setup.

For each setup (``--setups``) and each point (``core/crashpoints.py``, found from the code; ``--stages``
keeps the points whose name starts with one of the given prefixes, to shard the walk), one ``astraflow
run`` of the math example to ``--versions`` with the point armed to fire once on its ``--pass``-th pass
(not the first: by then the stage has state to lose), through ``chaos/crash_runs.py``; for the trainer's
points (``trainer.``, ``checkpoint.``, ``seal.``, ``publish.``) also twice in a row at the same point and
once at it and once at the next; a checkpoint's and a seal's file sync also with a full disk (ENOSPC
raised there instead of a kill). A point on a recovery path (``AFTER``: removing the checkpoint of a
version that never committed) is armed after a kill at the point that leaves that state. Runs sign their
weights (so the checkpoint seals are written) and
checkpoint every ``--checkpoint-every`` versions (so the checkpoint points are reached early).

Setups: ``embedded-native`` (the embedded log), ``kafka-native`` and ``kafka-faust`` (a local one-node
broker each). A point that does not run on a setup (``faust.`` off the faust runtime, ``stream.`` on it,
``embedded.`` on Kafka, the system evaluator's outside ``solver_verifier``, a sharded checkpoint with one
rank) is listed as not applicable; one that applies but did not fire in its run is ``unreached`` and
counts against the walk, as a problem does.

Per run, from the records alone (``check``): trajectories lost, trained twice, trainer fall-backs behind
a committed checkpoint, version numbers naming two weights, the version target reached.

    .venv/bin/python benchmarks/crashpoints.py [--setups embedded-native,kafka-native,kafka-faust]
        [--stages trainer,checkpoint] [--labels 'checkpoint.prune twice;...'] [--out results/crashpoints-SHARD.json]
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
ON_FAILURE_ONLY = {
    "embedded.commit_offsets": "no component commits offsets outside a transaction (astraflow tail --group does)",
    "evaluator.flush_dead_letter": "only after an evaluation that failed",
    "trainer.flush_skipped": "only after a step with a non-finite loss (tests/integration/test_bad_records.py)",
    "publish.flush_manifest": "only a publish outside a transaction (benchmarks/weights.py; the trainer's is in one)",
    "rollout.commit_turns": "only episodes of several turns",
    "rollout.turns_committed": "only episodes of several turns (tests/e2e/test_episode_resume.py, rooms)",
}
"""Points no run of the math example reaches, and where they are reached instead."""
ONCE_PER_PROCESS = frozenset({"trainer.flush_start"})
"""Points a process passes once (its start): armed on their first pass, not ``--passes``."""
FULL_DISK = ("checkpoint.fsync_file", "seal.fsync_file")
"""Points also walked with a full disk instead of a kill (``!enospc``: the write fails with ENOSPC and
the trainer ends with that error; its restart must resume as after a kill)."""
RARE_AFTER_RESTART = frozenset({"checkpoint.prune"})
"""Points a restarted trainer may pass only once before the version target (pruning needs more named
checkpoints than ``keep``): armed on their first pass when they are the second kill of a pair (the
restarted process's pass)."""
AFTER = {
    "checkpoint.remove_uncommitted": "trainer.checkpoint_written",
    "checkpoint.remove_unfinished": "checkpoint.fsync_file",
}
"""Points on a recovery path, reached only by a process started after a crash at another point: the
checkpoint of a version that never committed, a checkpoint directory left half written."""
SETTINGS = {"checkpoint.remove_uncommitted": {"checkpoint_every": 1}}
"""``train`` settings a point's runs need over the walk's. A restarted trainer numbers its first version
after the ledger's highest, so it writes the checkpoint of a number that has an uncommitted one only when
that number is the next checkpoint due: with ``checkpoint_every`` 1 (with 3, the next due is 3 above)."""


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
    return ON_FAILURE_ONLY.get(point)


def plans(points: list[str], setup: str, passes: int) -> list[tuple[str, list[str]]]:
    """(label, entries) of every run of ``setup``: each point once, then the trainer's in pairs (the
    single kills first, so that a walk cut short has covered every point)."""
    singles, pairs = [], []
    for index, point in enumerate(points):
        if applicable(point, setup):
            continue
        if point in AFTER:
            singles.append((point, [f"{AFTER[point]}#{passes}", f"{point}#1"]))
            continue
        singles.append((point, [armed(point, passes)]))
        if point in FULL_DISK:
            singles.append((f"{point} full disk", [f"{armed(point, passes)}!enospc"]))
        if point.startswith(TRAINER_STAGES):
            pairs.append((f"{point} twice", [armed(point, passes), armed_after_restart(point, passes)]))
            following = next((p for p in points[index + 1 :] if p.startswith(TRAINER_STAGES)), None)
            if following and not applicable(following, setup) and following not in AFTER:
                second = armed_after_restart(following, passes)
                pairs.append((f"{point} then {following}", [armed(point, passes), second]))
    return singles + pairs


def armed(point: str, passes: int) -> str:
    """The entry that kills at ``point`` on its ``passes``-th pass (the first, for ``ONCE_PER_PROCESS``)."""
    return f"{point}#{1 if point in ONCE_PER_PROCESS else passes}"


def armed_after_restart(point: str, passes: int) -> str:
    """The entry of the second kill of a pair, in the restarted process (``RARE_AFTER_RESTART``)."""
    return armed(point, 1) if point in RARE_AFTER_RESTART else armed(point, passes)


def walk(setup: str, points: list[str], args: argparse.Namespace, work: Path, save) -> dict:
    """Every run of ``setup``; a Kafka setup on a broker of its own. ``save(found)`` after each run, so
    a walk cut short keeps what it ran."""
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
        labels = {label for label in args.labels.split(";") if label}
        for label, entries in plans(points, setup, args.passes):
            if labels and label not in labels:
                continue
            print(f"{setup}: {label}", flush=True)
            train = {**overrides["train"], **SETTINGS.get(label, {})}
            result = armed_run(
                work / setup,
                f"run{len(runs)}",
                entries,
                setup=setup,
                bootstrap=broker.bootstrap if broker else None,
                versions=args.versions,
                minutes=args.minutes,
                overrides={**overrides, "train": train},
            )
            runs.append({"label": label, **result.to_dict()})
            print(f"  {result.problems or 'ok'}{' (unreached)' if result.unreached else ''}", flush=True)
            save(found(runs, points, setup))
    finally:
        if broker is not None:
            broker.stop()
    return found(runs, points, setup)


def found(runs: list[dict], points: list[str], setup: str) -> dict:
    """A setup's result: its runs, the points that do not apply to it, the runs that failed."""
    skipped = {point: applicable(point, setup) for point in points if applicable(point, setup)}
    failed = [run["label"] for run in runs if run["problems"] or run["unreached"]]
    return {"runs": runs, "not_applicable": skipped, "failed": failed}


def merge(paths: list[Path], passes: int = 2) -> dict:
    """The shards' setups and runs as one result: a later shard's run of the same label replaces one, and
    runs the harness no longer plans (a shard of an older version of it) are left out. A merged result
    (the committed one) may be a shard: its own shards are listed, its runs taken as the rest are."""
    points = sorted({name for name, _, _ in crash_point_names()})
    merged: dict = {"setups": {}, "shards": []}
    for path in paths:
        shard = json.loads(path.read_text())
        if "shards" in shard:
            merged["shards"] += shard["shards"]
        else:
            merged["shards"].append(
                {"file": path.name, "inputs": shard.get("inputs"), "provenance": shard.get("provenance")}
            )
        for setup, found in shard["setups"].items():
            target = merged["setups"].setdefault(setup, {"runs": [], "not_applicable": {}, "failed": []})
            planned = {label for label, _ in plans(points, setup, passes)}
            kept = {run["label"]: run for run in target["runs"]}
            kept.update({run["label"]: run for run in found["runs"] if run["label"] in planned})
            target["runs"] = list(kept.values())
            target["not_applicable"] = {p: applicable(p, setup) for p in points if applicable(p, setup)}
            target["failed"] = [label for label, run in kept.items() if run["problems"] or run["unreached"]]
    merged["points"] = points
    merged["summary"] = {setup: summarize(found) for setup, found in merged["setups"].items()}
    return merged


def summarize(found: dict) -> dict:
    """One setup's totals: runs, the single-point runs, and what every run's records showed."""
    runs = found["runs"]
    return {
        "runs": len(runs),
        "single_point_runs": sum(1 for run in runs if " " not in run["label"]),
        "pair_runs": sum(1 for run in runs if " twice" in run["label"] or " then " in run["label"]),
        "full_disk_runs": sum(1 for run in runs if run["label"].endswith(" full disk")),
        "with_problems": sum(1 for run in runs if run["problems"]),
        "unreached": sum(1 for run in runs if run["unreached"]),
        "lost": sum(run["lost"] for run in runs),
        "trained_twice": sum(run["trained_twice"] for run in runs),
        "fallbacks": sum(len(run["fallbacks"]) for run in runs),
        "reused_versions": sum(len(run["reused_versions"]) for run in runs),
        "not_applicable": len(found["not_applicable"]),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = list(result["summary"])
    kinds = ("held", "failed", "not applicable")
    counts: dict[str, list[int]] = {kind: [] for kind in kinds}
    for setup in setups:
        totals, failed = result["summary"][setup], len(result["setups"][setup]["failed"])
        counts["held"].append(totals["runs"] - failed)
        counts["failed"].append(failed)
        counts["not applicable"].append(totals["not_applicable"])
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
    parser.add_argument("--labels", default="", help="';'-separated run labels to run alone (a re-run of some)")
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--passes", type=int, default=2, help="kill on this pass of the point")
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "crashpoints.json")
    parser.add_argument("--merge", type=Path, nargs="*", help="merge these shard results into --out")
    args = parser.parse_args()
    if args.merge:
        result = merge(args.merge, args.passes)
        args.out.write_text(json.dumps(result, indent=2))
        plot(result, args.out.with_suffix(".png"))
        return
    record = begin(EXAMPLE)
    prefixes = tuple(p for p in args.stages.split(",") if p)
    points = sorted({name for name, _, _ in crash_point_names() if not prefixes or name.startswith(prefixes)})
    print(f"{len(points)} crash points to walk", flush=True)
    setups: dict[str, dict] = {}

    def save(setup: str, partial: dict | None = None) -> dict:
        if partial is not None:
            setups[setup] = partial
        result = {
            "inputs": {**vars(args), "out": str(args.out), "merge": None, "points": points},
            "setups": setups,
            "provenance": finish(record),
            "load_average_at_end": os.getloadavg(),
        }
        args.out.write_text(json.dumps(result, indent=2))
        return result

    with tempfile.TemporaryDirectory(prefix="crashpoints-") as tmp:
        for setup in args.setups.split(","):
            setups[setup] = walk(setup, points, args, Path(tmp), lambda partial, s=setup: save(s, partial))
    save(args.setups.split(",")[-1])
    print(json.dumps({setup: found["failed"] for setup, found in setups.items()}, indent=2))


if __name__ == "__main__":
    main()
