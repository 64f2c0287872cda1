"""The main job as ``make demo`` runs it, recorded as the README's main figure.

``make demo`` installs and then runs ``astraflow run examples/math/config.yaml`` in a new run
directory; this runs the same command in ``--run-dir`` (a new one) and writes the run's
``summary.json`` with its provenance (``provenance.py``: commit, command, config and lock hashes,
load) to ``benchmarks/results/main_job_summary.json``, and its report to ``main_job_report.png``.
The figure to quote is the base the warm-up reached (``base_accuracy``) and the mean of the run's
last two evaluations (``final_mean_of_last_two``), not the single evaluation that met the target.

    .venv/bin/python benchmarks/main_job.py --run-dir runs/main-job
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "math" / "config.yaml"
RESULTS = REPO / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a new run directory")
    args = parser.parse_args()
    if args.run_dir.exists():
        parser.error(f"{args.run_dir} exists: the main job starts a new run")
    record = begin(CONFIG)
    astraflow = Path(sys.executable).with_name("astraflow")
    subprocess.run([str(astraflow), "run", str(CONFIG), "--run-dir", str(args.run_dir), "--no-dashboard"], check=True)
    summary = json.loads((args.run_dir / "summary.json").read_text())
    by_version = {int(v): accuracy for v, accuracy in summary["accuracy_by_version"].items()}
    last_two = [by_version[v] for v in sorted(by_version)[-2:]]
    summary["final_mean_of_last_two"] = round(sum(last_two) / len(last_two), 4)
    summary["provenance"] = finish(record)
    (RESULTS / "main_job_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = args.run_dir / "report.png"
    if report.exists():
        shutil.copy(report, RESULTS / "main_job_report.png")
    print(json.dumps({k: summary[k] for k in ("base_accuracy", "final_mean_of_last_two", "versions", "wall_seconds")}))


if __name__ == "__main__":
    main()
