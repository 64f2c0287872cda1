"""Agentic workloads: reward and success rate against wall time, and sandbox executions per second.

Each example named by ``--examples`` (default: ``search``, ``code``, ``rooms`` and
``solver_verifier``) runs as ``astraflow run examples/<name>/config.yaml`` with every component
its own process on the embedded log, for ``--minutes`` (default 10) after its warm-up, with no
accuracy target: the run ends on time. From the run's ``metrics.jsonl``: the evaluator's greedy
held-out success (``eval.accuracy``, one episode per held-out task) and the producers' mean
sampled reward per batch (``rollout.mean_reward``), against seconds since the components started;
the warm-up (base checkpoint, cached under ``$ASTRAFLOW_CACHE`` like a user's) is timed apart.
``--cold`` gives each run a fresh cache.

Each run's ``result`` is what the README quotes, per policy: the base (version 0's evaluation),
the final score as the mean of the last two held-out evaluations, the gain, versions and minutes.
For solver + verifier it adds the system evaluation of the last three evaluated version pairs: the
solver alone (one sample), the verifier's choice among k samples, a majority vote over the same k,
pass@k, and the share of the gap between the solver alone and pass@k the verifier's choice recovers.
Each run records its own provenance (``provenance.py``: commit, command, config and lock hashes,
load), since ``--merge`` keeps runs of earlier invocations beside it; the report records the
invocation's.

Sandbox throughput: ``--sandbox-runs`` executions of a one-line program (read n, print 3n+1) in
each backend that works here, one at a time and from ``--workers`` threads, the way the code
environment's ``tool_workers`` run tests; executions/s and the median wall time of one run. And
tests/s of one program's 5 tests run one sandbox each (as the code environment once did), all 5 in
one sandbox (``run_python_tests``), and 16 programs' tests in one sandbox (``run_python_programs``,
as the code environment runs a chunk of a generation's programs now, with the code example's 4 KiB
output cap), side by side.

``--kill-producers N``: each example runs twice with the same config, once as above and once with
its rollout producer SIGKILLed N times, each time at the ``--kill-every``-th commit of completed turns
of the producer's life (right after it: ``rollout.turns_committed``, ``core/crashpoints.py``; the launcher restarts it,
and the restarted producer resumes the episodes from their recorded turns). Per example it records
both runs' held-out results side by side and what resuming saved, from the producers' own counters:
episodes resumed, policy turns taken from the journal instead of generated again, and the generation
and environment seconds those turns had cost (``rollout.resumed_seconds``), against the turns
generated in all.

The machine is whatever it is (2 shared cores in this project): the load average at the start and
end of each part is recorded. Writes ``benchmarks/results/agentic.json`` and ``agentic.png``.

    .venv/bin/python benchmarks/agentic.py [--examples search,code] [--minutes 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")


def run_example(name: str, minutes: float, work: Path, cold: bool, kills: int = 0, kill_every: int = 20) -> dict:
    """``astraflow run`` of one example; its curves, summary and timings. With ``kills``, its rollout producer
    is killed that many times at its ``kill_every``-th commit of turns (module docstring)."""
    from astraflow.core.crashpoints import ENV, RECORD_ENV

    raw = yaml.safe_load((REPO / "examples" / name / "config.yaml").read_text())
    raw["run"] = f"bench-{name}" + (f"-killed{kills}" if kills else "")
    name_dir = name + (f"-killed{kills}" if kills else "")
    raw["stop"] = {"max_minutes": minutes, "target_accuracy": None}  # on time, never on what is reported
    config = work / f"{name_dir}.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = work / name_dir
    env = dict(os.environ)
    record_dir = work / f"{name_dir}-crash-record"
    if kills:
        record_dir.mkdir()
        env.update({ENV: ",".join([f"rollout.turns_committed#{kill_every}"] * kills), RECORD_ENV: str(record_dir)})
    if cold:
        env["ASTRAFLOW_CACHE"] = str(work / f"cache-{name}")
    load_before = os.getloadavg()
    record = begin(REPO / "examples" / name / "config.yaml")  # before the run: a later commit is not what it ran
    started = time.perf_counter()
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        capture_output=True,
        text=True,
        env=env,
    )
    if result.returncode != 0:
        raise SystemExit(f"astraflow run {name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    warmup = (
        json.loads((run_dir / "base" / "warmup.json").read_text())
        if (run_dir / "base" / "warmup.json").is_file()
        else None
    )

    def curve(metric: str) -> list[dict]:
        return [
            {"seconds": row["wall_s"], "version": row["step"], "value": row["value"]}
            for row in sorted(rows, key=lambda r: r["wall_s"])
            if row["name"] == metric
        ]

    resumed = resume_counters(rows)
    if kills:
        resumed["producer_kills"] = len(list(record_dir.iterdir()))
    return {
        "example": name,
        "producer_kills_armed": kills,
        "resume": resumed,
        "result": quoted_result(summary),
        "config": raw,
        "total_seconds": time.perf_counter() - started,
        "warmup_seconds": summary["warmup_seconds"],
        "warmup": warmup,
        "summary": summary,
        "heldout_success": curve("eval.accuracy"),
        "sampled_reward": curve("rollout.mean_reward"),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "provenance": finish(record),
    }


def resume_counters(rows: list[dict]) -> dict:
    """The producers' episode counters at the end of a run, summed over every producer process."""
    from astraflow.core.metric_names import (
        ROLLOUT_EPISODES_RESUMED,
        ROLLOUT_RESUMED_SECONDS,
        ROLLOUT_TURNS_GENERATED,
        ROLLOUT_TURNS_RESUMED,
    )

    names = {
        ROLLOUT_TURNS_GENERATED: "turns_generated",
        ROLLOUT_TURNS_RESUMED: "turns_resumed",
        ROLLOUT_EPISODES_RESUMED: "episodes_resumed",
        ROLLOUT_RESUMED_SECONDS: "resumed_seconds",
    }
    last: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["name"] in names:  # cumulative per process: its last value
            last[names[row["name"]], row.get("labels", {}).get("instance", row["component"])] = row["value"]
    return {key: sum(v for (k, _), v in last.items() if k == key) for key in names.values()}


def policy_result(accuracy_by_version: dict[str, float], versions: int, minutes: float) -> dict:
    """Base, the mean of the last two held-out evaluations after it, the gain, versions, minutes."""
    from astraflow.infra.launch.monitor import gain_over_base  # the definition the e2e tests assert on

    accuracy = {int(version): value for version, value in accuracy_by_version.items()}
    base, gain = accuracy.get(0, float("nan")), gain_over_base(accuracy)
    final = base + gain if gain > float("-inf") else float("nan")
    return {
        "base": base,
        "final_last_two": final,
        "gain": final - base,
        "evaluations": len(accuracy),
        "versions": versions,
        "minutes": minutes,
    }


def quoted_result(summary: dict) -> dict:
    """What the README quotes of one run (see the module docstring)."""
    minutes = summary["wall_seconds"] / 60
    if "policies" not in summary:
        return {"main": policy_result(summary["accuracy_by_version"], summary["versions"], minutes)}
    out = {
        name: policy_result(policy["accuracy_by_version"], policy["versions"], minutes)
        for name, policy in summary["policies"].items()
    }
    pairs = list(summary.get("system_accuracy", {}).get("by_versions", {}).items())
    if pairs:
        late = [figures for _, figures in pairs[-3:]]

        def mean(key: str) -> float:
            return sum(figures[key] for figures in late) / len(late)

        alone, judged, majority, pass_at_k = mean("alone"), mean("judged"), mean("majority"), mean("pass_at_k")
        out["system"] = {
            "version_pairs": [pair for pair, _ in pairs[-3:]],
            "base": pairs[0][1],
            "alone": alone,
            "judged": judged,
            "majority": majority,
            "pass_at_k": pass_at_k,
            "gap_recovered": (judged - alone) / (pass_at_k - alone) if pass_at_k > alone else float("nan"),
        }
    return out


def sandbox_throughput(runs: int, workers: int) -> list[dict]:
    """Executions/s of each working backend, sequential and with ``workers`` threads."""
    from astraflow.sandbox import BACKENDS, SandboxLimits, probe

    program, results = "n=int(input())\nprint(n*3+1)\n", []
    for name, backend in BACKENDS.items():
        box = backend(SandboxLimits(wall_seconds=2.0, cpu_seconds=1, memory_mb=256))
        problem = probe(box)
        if problem is not None:
            results.append({"backend": name, "error": problem})
            continue
        entry = {"backend": name, "loadavg_before": os.getloadavg()}
        for threads in (1, workers):
            latencies: list[float] = []

            def one(i: int) -> None:
                t0 = time.perf_counter()
                result = box.run_python(program, stdin=f"{i}\n")
                latencies.append(time.perf_counter() - t0)
                if result.stdout.strip() != str(3 * i + 1):
                    raise RuntimeError(f"{name}: wrong output {result.stdout!r} ({result.describe()})")

            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(runs)))
            elapsed = time.perf_counter() - started
            entry[f"threads_{threads}"] = {
                "executions_per_s": runs / elapsed,
                "median_ms": 1000 * statistics.median(latencies),
                "runs": runs,
            }
        small = backend(SandboxLimits(wall_seconds=2.0, cpu_seconds=1, memory_mb=256, max_output_bytes=4096))
        entry["tests_batched_vs_one_run_each"] = tests_throughput(box, small, rounds=max(16, runs // 5 // 16 * 16))
        entry["loadavg_after"] = os.getloadavg()
        results.append(entry)
    return results


def tests_throughput(box, small, rounds: int, tests: int = 5, together: int = 16) -> dict:
    """Tests/s of ``rounds`` programs with ``tests`` inputs each: one sandbox run per test, one per program,
    and one per ``together`` programs (in ``small``, the box with the code example's output cap)."""
    program, stdins = "n=int(input())\nprint(n*3+1)\n", [f"{i}\n" for i in range(tests)]
    expected = [f"{3 * i + 1}\n" for i in range(tests)]
    ways = {
        "one_run_each": lambda: [[box.run_python(program, stdin) for stdin in stdins]],
        "batched": lambda: [box.run_python_tests(program, stdins)],
        "programs_together": lambda: small.run_python_programs([(program, stdins)] * together),
    }
    entry = {"tests_per_program": tests, "programs": rounds, "programs_per_sandbox_together": together}
    for way, run in ways.items():
        started = time.perf_counter()
        done = 0
        while done < rounds:
            for results in run():
                done += 1
                if [r.stdout for r in results] != expected:
                    raise RuntimeError(
                        f"{box.name} {way}: wrong outputs {[r.stdout for r in results]} "
                        f"({[r.describe() for r in results]})"
                    )
        entry[f"{way}_tests_per_s"] = done * tests / (time.perf_counter() - started)
    entry["speedup"] = entry["batched_tests_per_s"] / entry["one_run_each_tests_per_s"]
    entry["together_speedup"] = entry["programs_together_tests_per_s"] / entry["one_run_each_tests_per_s"]
    return entry


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    figure, axes = plt.subplots(1, len(runs) + 1, figsize=(5.5 * (len(runs) + 1), 4.2))
    for ax, run in zip(axes, runs):
        success, sampled = run["heldout_success"], run["sampled_reward"]
        ax.plot(
            [p["seconds"] for p in success],
            [p["value"] for p in success],
            "o-",
            label="held-out success (greedy, evaluator)",
        )
        ax.plot(
            [p["seconds"] for p in sampled],
            [p["value"] for p in sampled],
            ".",
            alpha=0.5,
            label="sampled reward (rollout batches)",
        )
        killed = f", producer killed {run['resume'].get('producer_kills')}x" if run.get("producer_kills_armed") else ""
        ax.set_title(f"{run['example']}{killed} (warm-up {run['warmup_seconds']:.0f} s, not shown)")
        ax.set_xlabel("seconds since the components started")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("reward / success rate")
    bars = axes[-1]
    names, values = [], []
    for entry in report["sandbox"]:
        for key, stats in entry.items():
            if key.startswith("threads_"):
                names.append(f"{entry['backend']}\n{key.split('_')[1]} thread(s)")
                values.append(stats["executions_per_s"])
    bars.bar(names, values, color="tab:green")
    bars.set_title("sandbox executions per second")
    bars.set_ylabel("executions / s")
    figure.suptitle(
        f"AstraFlow agentic examples on {report['machine']['cpus']} CPUs "
        f"(load avg at start {report['machine']['loadavg_at_start'][0]:.1f})"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def ran_at(run: dict) -> str:
    """The commit a run recorded: runs kept by ``--merge`` from before provenance record only ``commit``."""
    return run["provenance"]["commit"] if "provenance" in run else run.get("commit", "an unrecorded commit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--examples", default="search,code,rooms,solver_verifier", help="comma-separated example names under examples/"
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="stop.max_minutes of each run (after its warm-up)")
    parser.add_argument("--cold", action="store_true", help="warm each base checkpoint up anew (own cache per run)")
    parser.add_argument("--sandbox-runs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--kill-producers", type=int, default=0, help="also run each example with its producer killed this often"
    )
    parser.add_argument("--kill-every", type=int, default=20, help="commits of turns of a producer before its kill")
    parser.add_argument("--skip-sandbox", action="store_true", help="leave the sandbox figures out of this invocation")
    parser.add_argument("--output", type=Path, default=RESULTS / "agentic.json")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace only these examples' runs (and the sandbox figures) in an existing --output",
    )
    args = parser.parse_args()

    record = begin()  # several examples, each with its config: their hashes are in each run's provenance
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": os.getloadavg()},
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    report["sandbox"] = [] if args.skip_sandbox else sandbox_throughput(args.sandbox_runs, args.workers)
    work = Path(tempfile.mkdtemp(prefix="astraflow-agentic-"))
    try:
        report["runs"] = [run_example(name, args.minutes, work, args.cold) for name in args.examples.split(",")]
        if args.kill_producers:
            report["runs"] += [
                run_example(name, args.minutes, work, args.cold, args.kill_producers, args.kill_every)
                for name in args.examples.split(",")
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.merge and args.output.is_file():  # runs of other examples are kept, each with the machine load it ran under
        fresh = {(run["example"], run.get("producer_kills_armed", 0)) for run in report["runs"]}
        old = json.loads(args.output.read_text())
        kept = [run for run in old["runs"] if (run["example"], run.get("producer_kills_armed", 0)) not in fresh]
        report["runs"] = kept + report["runs"]
        if args.skip_sandbox:
            report["sandbox"] = old.get("sandbox", [])
    for run in report["runs"]:
        for policy, r in run.get("result", {}).items():
            if policy == "system":
                print(
                    f"{run['example']} system, last three version pairs: alone {r['alone']:.3f}, verifier's choice "
                    f"{r['judged']:.3f}, majority {r['majority']:.3f}, pass@k {r['pass_at_k']:.3f} "
                    f"({r['gap_recovered']:.0%} of the gap recovered)"
                )
                continue
            print(
                f"{run['example']} {policy}: held-out {r['base']:.3f} -> {r['final_last_two']:.3f} "
                f"(mean of the last two, {r['gain']:+.3f}) in {r['versions']} versions, {r['minutes']:.1f} min "
                f"after a {run['warmup_seconds']:.0f} s warm-up, at {ran_at(run)}"
                + (
                    f", producer killed {run['resume'].get('producer_kills')} times"
                    if run.get("producer_kills_armed")
                    else ""
                )
            )
        if run.get("producer_kills_armed"):
            s = run["resume"]
            print(
                f"{run['example']} resumed {s['episodes_resumed']:.0f} episodes: {s['turns_resumed']:.0f} policy turns "
                f"not played again ({s['resumed_seconds']:.1f} s of generation and tools), "
                f"{s['turns_generated']:.0f} generated in all"
            )
    for entry in report["sandbox"]:
        rates = {k: round(v["executions_per_s"], 1) for k, v in entry.items() if k.startswith("threads_")}
        print(f"sandbox {entry['backend']}: {rates or entry.get('error')} executions/s")
        if "tests_batched_vs_one_run_each" in entry:
            t = entry["tests_batched_vs_one_run_each"]
            print(
                f"sandbox {entry['backend']}: {t['one_run_each_tests_per_s']:.1f} tests/s one run each, "
                f"{t['batched_tests_per_s']:.1f} batched ({t['speedup']:.1f}x), "
                f"{t.get('programs_together_tests_per_s', float('nan')):.1f} with "
                f"{t.get('programs_per_sandbox_together')} programs a sandbox "
                f"({t.get('together_speedup', float('nan')):.1f}x)"
            )
    report["provenance"] = finish(record)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    plot(report, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and its .png")


if __name__ == "__main__":
    main()
