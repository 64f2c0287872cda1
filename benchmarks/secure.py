"""The math example learning on the secure dev broker: one node and three, both stream runtimes.

For each broker size (``astraflow broker start --secure``, and ``--nodes 3``) and each stream
runtime (faust, native), one ``astraflow run examples/math/config.yaml`` of ``--versions`` versions
on Kafka with ``log.security.role_credentials``: the launcher makes the topics and grants the ACLs as
``admin``, and every component logs in as its own role with least privilege (``astraflow/infra/broker/acls.py``).
Per run: held-out exact match of the base and the mean of the last two evaluations, versions per
minute from version 1 to the last (start-up left out), and whether any component met a refusal
(``may not`` or an authorization error in its log). With ``--plaintext`` the same runs on a
plaintext broker too, for the cost of TLS and SCRAM side by side.

Writes ``results/secure.json`` (with its provenance: ``provenance.py``) and ``results/secure.png``.

    .venv/bin/python benchmarks/secure.py [--versions 50] [--plaintext]
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
from astraflow.infra.broker.local import default_home
from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")
RUNTIMES = ("faust", "native")


def start_broker(home: Path, nodes: int, secure: bool) -> str:
    port = free_port(span=nodes)
    command = [str(ASTRAFLOW), "broker", "start", "--home", str(home), "--port", str(port)]
    command += ["--jars", str(default_home()), "--timeout", "180"]
    command += ["--secure"] if secure else []
    command += ["--nodes", str(nodes)] if nodes > 1 else []
    started = subprocess.run(command, capture_output=True, text=True, timeout=400)
    if started.returncode != 0:
        raise RuntimeError(f"broker start failed: {started.stdout}{started.stderr}")
    return ",".join(f"127.0.0.1:{port + n}" for n in range(nodes))


def one_run(work: Path, bootstrap: str, credentials: Path | None, runtime: str, versions: int, name: str) -> dict:
    run_dir = work / name
    log: dict = {"backend": "kafka", "bootstrap": bootstrap}
    if credentials is not None:
        log["security"] = {
            "protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "role_credentials": str(credentials),
            "ca_file": str(credentials / "ca.pem"),
        }
    config = write_config_over(
        EXAMPLE,
        work / f"{name}.yaml",
        run=f"{name}-{os.getpid()}",
        log=log,
        stream={"runtime": runtime},
        stop={"max_minutes": 20, "max_versions": versions, "target_accuracy": None},
    )
    started = time.monotonic()
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    logs = "".join(path.read_text(errors="replace") for path in (run_dir / "logs").glob("*"))
    if result.returncode != 0:
        raise RuntimeError(f"{name}: astraflow run failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    reached: dict[int, float] = {}
    evaluations: dict[int, float] = {}
    for metric in metrics:
        if metric["name"] == "train.version":
            reached.setdefault(int(metric["value"]), metric["wall_s"])
        elif metric["name"] == "eval.accuracy":
            evaluations[int(metric["step"])] = metric["value"]
    summary = json.loads((run_dir / "summary.json").read_text())
    last = max(reached)
    ordered = [evaluations[v] for v in sorted(evaluations)]
    return {
        "run": name,
        "runtime": runtime,
        "secure": credentials is not None,
        "versions": last,
        "versions_per_minute": 60 * (last - 1) / (reached[last] - reached[1]),
        "base_accuracy": summary["base_accuracy"],
        "last_two_mean_accuracy": sum(ordered[-2:]) / len(ordered[-2:]),
        "gain": sum(ordered[-2:]) / len(ordered[-2:]) - summary["base_accuracy"],
        "accuracy_by_version": {str(v): evaluations[v] for v in sorted(evaluations)},
        "refusals": logs.count("may not") + logs.lower().count("authorization failed"),
        "command_seconds": time.monotonic() - started,
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for index, run in enumerate(runs):
        points = sorted((int(v), a) for v, a in run["accuracy_by_version"].items())
        ax.plot([v for v, _ in points], [a for _, a in points], marker="o", color=f"C{index}", label=run["run"])
    ax.set(xlabel="version", ylabel="held-out exact match", title="math example on the secure broker")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=50)
    parser.add_argument("--plaintext", action="store_true", help="Also run on a plaintext broker of each size.")
    parser.add_argument("--out", type=Path, default=RESULTS / "secure.json")
    args = parser.parse_args()
    record = begin(EXAMPLE)
    runs = []
    with tempfile.TemporaryDirectory(prefix="secure-") as tmp:
        work = Path(tmp)
        for nodes in (1, 3):
            for secure in (True, False) if args.plaintext else (True,):
                home = work / f"broker-{nodes}-{'secure' if secure else 'plain'}"
                bootstrap = start_broker(home, nodes, secure)
                try:
                    for runtime in RUNTIMES:
                        name = f"{nodes}node-{'secure' if secure else 'plain'}-{runtime}"
                        credentials = home / "security" if secure else None
                        runs.append(one_run(work, bootstrap, credentials, runtime, args.versions, name))
                        print(json.dumps({k: v for k, v in runs[-1].items() if k != "accuracy_by_version"}), flush=True)
                finally:
                    subprocess.run([str(ASTRAFLOW), "broker", "stop", "--home", str(home)], capture_output=True)
    result = {
        "inputs": {"versions": args.versions, "plaintext": args.plaintext, "example": str(EXAMPLE.relative_to(REPO))},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "runs": runs,
        "provenance": finish(record),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(runs, args.out.with_suffix(".png"))
    print(json.dumps([{k: v for k, v in r.items() if k != "accuracy_by_version"} for r in runs], indent=2))


if __name__ == "__main__":
    main()
