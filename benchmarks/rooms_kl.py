"""Rooms with and without a KL term to the base: does the early dip go away?

"Learning I" measured the rooms example's held-out success dipping to 0.24-0.63 somewhere between
versions 4 and 25 before it climbs, at a depth and version that vary from run to run. For each KL
coefficient of ``--coefs`` (0: no term) this runs ``astraflow run examples/rooms/config.yaml``
``--runs`` times to ``--versions`` versions from the same cached base (the warm-up's cache), with
``train.kl`` (reference the base, estimator ``--estimator``) and an evaluation every version, and
records each run's held-out success by version.

Per coefficient: the runs with a dip (an evaluation from ``--from-version`` on below the base minus
``--margin``), the lowest evaluation from there, and the mean of the last two evaluations. A
coefficient "removes the dip" when no run of it has one; the example takes the smallest such
coefficient, and a rooms learning test joins the suite, only if one does.

Writes ``results/rooms_kl.json`` and ``results/rooms_kl.png`` (``--out``).

    .venv/bin/python benchmarks/rooms_kl.py [--coefs 0,0.01,0.05,0.2] [--runs 4] [--versions 24]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "rooms" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")


def one_run(work: Path, name: str, coef: float, args: argparse.Namespace) -> dict:
    """``astraflow run`` of the rooms example with a KL coefficient of ``coef``; its held-out curve."""
    from astraflow.config import write_config_over

    run_dir = work / name
    kl = {"coef": coef, "estimator": args.estimator, "reference": "base"} if coef > 0 else {"coef": 0.0}
    config = write_config_over(
        EXAMPLE,
        work / f"{name}.yaml",
        run=name,
        train={"kl": kl},
        eval={"every_versions": 1},
        stop={"max_versions": args.versions, "max_minutes": args.minutes, "target_accuracy": None},
    )
    with (work / f"{name}.out").open("wb") as out:
        done = subprocess.run(
            [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {(work / f'{name}.out').read_text()[-3000:]}")
    from astraflow.core.metric_names import TRAIN_KL

    summary = json.loads((run_dir / "summary.json").read_text())
    curve = {int(v): a for v, a in summary["accuracy_by_version"].items()}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kl = [row["value"] for row in rows if row["name"] == TRAIN_KL]  # the term ran: its KL per version
    return {
        "name": name,
        "coef": coef,
        "versions": summary["versions"],
        "accuracy_by_version": curve,
        "mean_kl": sum(kl) / len(kl) if kl else None,
    }


def judged(runs: list[dict], args: argparse.Namespace) -> dict:
    """Per coefficient: runs with a dip, the lowest evaluation after ``--from-version``, the final means."""
    found = {}
    for coef in sorted({run["coef"] for run in runs}):
        mine = [run for run in runs if run["coef"] == coef]
        dips, lowest, finals = 0, [], []
        for run in mine:
            curve = run["accuracy_by_version"]
            base = curve[0]
            later = [a for v, a in curve.items() if v >= args.from_version]
            lowest += later
            dips += any(a < base - args.margin for a in later)
            last = [curve[v] for v in sorted(curve)[-2:]]
            finals.append(sum(last) / len(last) - base)
        found[str(coef)] = {
            "runs": len(mine),
            "runs_with_dip": dips,
            "lowest_after": min(lowest, default=None),
            "mean_final_gain": sum(finals) / len(finals),
            "removes_dip": dips == 0,
        }
    return found


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coefs = sorted({run["coef"] for run in result["runs"]})
    fig, axes = plt.subplots(1, len(coefs), figsize=(4 * len(coefs), 3.5), squeeze=False, sharey=True)
    for ax, coef in zip(axes[0], coefs):
        for run in (r for r in result["runs"] if r["coef"] == coef):
            curve = sorted((int(v), a) for v, a in run["accuracy_by_version"].items())
            ax.plot([v for v, _ in curve], [a for _, a in curve], alpha=0.7)
        verdict = result["by_coef"][str(coef)]
        ax.set(title=f"β={coef}: {verdict['runs_with_dip']}/{verdict['runs']} dip", xlabel="version")
    axes[0][0].set_ylabel("held-out success")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coefs", default="0,0.01,0.05,0.2")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--versions", type=int, default=24)
    parser.add_argument("--minutes", type=float, default=20.0, help="a safety cap per run")
    parser.add_argument("--estimator", default="k3")
    parser.add_argument("--from-version", type=int, default=5)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=RESULTS / "rooms_kl.json")
    args = parser.parse_args()
    record = begin(EXAMPLE)
    runs: list[dict] = []
    result: dict = {"inputs": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
    with tempfile.TemporaryDirectory(prefix="rooms-kl-") as tmp:
        for index in range(args.runs):  # round robin, so a walk cut short has every coefficient
            for coef in (float(c) for c in args.coefs.split(",")):
                runs.append(one_run(Path(tmp), f"roomskl{index}c{str(coef).replace('.', '')}", coef, args))
                result["by_coef"] = judged(runs, args)
                result["provenance"] = finish(record)
                args.out.write_text(json.dumps(result, indent=2))
                print(json.dumps({"run": runs[-1]["name"], **result["by_coef"][str(coef)]}), flush=True)
    plot(result, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
