"""Which committed benchmark figures are older than the code on their path, computed now.

A result file says what was measured, not whether it still holds: the code it measured goes on
changing. Each result file under ``benchmarks/results/`` declares here the paths its figures depend
on (its script, its configs, the modules on its measured path). For each, this prints the commit it
ran at - the ``provenance.commit`` its run recorded (``provenance.py``), or a bare ``commit`` where an
older run recorded only that, or else, marked ``committed``, the commit that added the file (the run
itself was older) - and how many commits touched those paths since. ``0`` means the
figure is of the code as it is; anything else is a figure to read with that many changes in mind,
or to re-run.

    .venv/bin/python benchmarks/staleness.py          # the table (markdown)
    .venv/bin/python benchmarks/staleness.py --json   # the same as JSON

The test suite prints the table at its end (``tests/conftest.py``), so it cannot go stale itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

WHOLE_SYSTEM = ["astraflow", "examples/math"]
"""A run of the whole system measures every package."""

DEPENDS: dict[str, list[str]] = {
    "agentic.json": ["benchmarks/agentic.py", "examples", "astraflow"],
    "agentic_kills.json": ["benchmarks/agentic.py", "examples/rooms", "astraflow"],
    "backends.json": ["benchmarks/backends.py", *WHOLE_SYSTEM],
    "chaos.json": ["benchmarks/chaos.py", *WHOLE_SYSTEM],
    "compose_stack.json": [
        "benchmarks/compose_stack.py",
        "docker-compose.yml",
        "Dockerfile",
        "deploy/stack",
        "scripts/stack.sh",
        *WHOLE_SYSTEM,
    ],
    "crashpoints.json": ["benchmarks/crashpoints.py", *WHOLE_SYSTEM],
    "checkpoint_cost.json": ["benchmarks/checkpoint_cost.py", "astraflow/training", "astraflow/consumers/trainer"],
    "data_algorithms.json": ["benchmarks/data_algorithms.py", "astraflow/streams", "astraflow/producers/feeder"],
    "elastic.json": ["benchmarks/elastic.py", *WHOLE_SYSTEM],
    "engines.json": ["benchmarks/engines.py", "astraflow/engines"],
    "fuzz.json": ["benchmarks/fuzz.py", "astraflow"],
    "log_throughput.json": ["benchmarks/log_throughput.py", "astraflow/log", "astraflow/schemas"],
    "main_job_summary.json": ["Makefile", "benchmarks/main_job.py", *WHOLE_SYSTEM],
    "multi_policy_real.json": ["benchmarks/multi_policy.py", "examples/solver_verifier", "astraflow"],
    "multi_policy_sim.json": ["benchmarks/multi_policy.py", "benchmarks/trainer_centred.py", "astraflow"],
    "prototype_grpo.json": ["benchmarks/prototype_grpo.py"],
    "rooms_kl.json": ["benchmarks/rooms_kl.py", "examples/rooms", "astraflow"],
    "secure.json": ["benchmarks/secure.py", *WHOLE_SYSTEM],
    "stream_throughput.json": [
        "benchmarks/stream_throughput.py",
        "astraflow/streams",
        "astraflow/log",
        "astraflow/schemas",
    ],
    "train_step.json": [
        "benchmarks/train_step.py",
        "benchmarks/bare_step.py",
        "astraflow/training",
        "astraflow/consumers/trainer",
    ],
    "trainer_scaling.json": ["benchmarks/trainer_scaling.py", "astraflow/training"],
    "vs_trl.json": ["benchmarks/vs_trl.py", *WHOLE_SYSTEM],
    "weights.json": ["benchmarks/weights.py", "astraflow/weights"],
}


@dataclass(frozen=True)
class Figure:
    result: str
    commit: str
    """The commit the run recorded, or the one that committed the file when the run recorded none."""
    recorded: bool
    """Whether ``commit`` is the run's own record (``False``: the file's commit; the run was older)."""
    paths: list[str]
    changes_since: int | None
    """Commits that touched ``paths`` after ``commit``; ``None`` where git cannot tell: a shallow clone,
    or a commit this history does not hold (one of a stop whose CI failed, re-committed under new hashes)."""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def recorded_commits(value: object) -> list[str]:
    """Every commit a result records, without the ``+dirty`` / ``-dirty`` mark: some files hold several
    runs, each with its own. Where an object holds a ``provenance`` (``provenance.py``), its ``commit``
    is the run's and a bare ``commit`` beside it is not counted; objects from before provenance hold
    only the bare ``commit``, which counts."""
    if isinstance(value, dict):
        provenance = value.get("provenance")
        candidates = [provenance.get("commit") if isinstance(provenance, dict) else None, value.get("commit")]
        found = [c for c in candidates if isinstance(c, str) and c][:1]
        return [c.split("+")[0].removesuffix("-dirty") for c in found] + [
            c for k, v in value.items() if k != "provenance" for c in recorded_commits(v)
        ]
    if isinstance(value, list):
        return [c for v in value for c in recorded_commits(v)]
    return []


def changes_since(commit: str, paths: list[str]) -> int | None:
    try:
        return int(git("rev-list", "--count", f"{commit}..HEAD", "--", *paths))
    except (subprocess.CalledProcessError, ValueError):
        return None


def figures() -> list[Figure]:
    """Each result with the commit it ran at (of several runs in one file, the stalest) and the
    commits on its paths since."""
    found = []
    for name, paths in sorted(DEPENDS.items()):
        result = RESULTS / name
        commits = recorded_commits(json.loads(result.read_text()))
        recorded = bool(commits)
        if not recorded:
            commits = [git("log", "-1", "--format=%h", "--", str(result.relative_to(REPO)))]
        counted = [(changes_since(commit, paths), commit) for commit in commits]
        changes, commit = max(counted, key=lambda pair: -1 if pair[0] is None else pair[0])
        found.append(Figure(name, commit, recorded, paths, changes))
    return found


def table(rows: list[Figure]) -> str:
    lines = ["| result | ran at | commits on its paths since | paths |", "|---|---|---|---|"]
    for row in rows:
        when = row.commit if row.recorded else f"{row.commit} (committed; the run recorded none)"
        since = str(row.changes_since) if row.changes_since is not None else _unknown(row.commit)
        lines.append(f"| {row.result} | {when} | {since} | {', '.join(row.paths)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    rows = figures()
    print(json.dumps([asdict(row) for row in rows], indent=1) if "--json" in sys.argv else table(rows))


def _unknown(commit: str) -> str:
    """Why the commits since ``commit`` cannot be counted."""
    try:
        git("cat-file", "-e", f"{commit}^{{commit}}")
    except subprocess.CalledProcessError:
        if git("rev-parse", "--is-shallow-repository") == "true":
            return "unknown (a shallow clone)"
        return "unknown (ran at a commit not in this history)"
    return "unknown"
