"""Runs killed at named crash points (``core/crashpoints.py``), and what their records must show after.

``armed_run`` starts ``astraflow run`` of the math example with ``ASTRAFLOW_CRASH_AT`` naming the
entries to fire and ``ASTRAFLOW_CRASH_RECORD`` a directory in the run, so each entry kills one process
once (the launcher restarts it), and runs it to a version target. ``check`` then reads the run's
records only - the trajectories, samples, ledger and dead letters through ``astraflow audit``'s
``audit_run``, the ledger for version numbers - and says what broke, if anything:

- an entry that never fired (its point was not reached: a faust point on the native runtime, a seal
  without a signing key) is reported apart, not as a failure;
- a trajectory lost, or trained twice in the surviving lineage;
- a trainer that resumed further behind its newest committed version than ``train.checkpoint_every``
  steps (``audit.fallbacks``);
- a version number that names two different weights (two ledger entries of that number whose
  payload sha256 differ);
- the run not reaching its version target.

Used by ``tests/e2e/test_crash_points.py`` (a point of every stage in one run) and
``benchmarks/crashpoints.py`` (every point in turn, on every setup).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from astraflow.core.crashpoints import ENV, RECORD_ENV

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "math" / "config.yaml"


@dataclass
class CrashRun:
    """One run with armed crash points and what its records show."""

    entries: list[str]
    setup: str
    versions: int = 0
    target: int = 0
    fired: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    trajectories: int = 0
    lost: int = 0
    trained_twice: int = 0
    fallbacks: list[str] = field(default_factory=list)
    reused_versions: list[int] = field(default_factory=list)
    lost_versions: int = 0
    epochs: int = 0
    seconds: float = 0.0
    failure: str = ""

    @property
    def problems(self) -> list[str]:
        """What the run's records show went wrong (empty: every guarantee held)."""
        found = [self.failure] if self.failure else []
        if self.versions < self.target:
            found.append(f"reached version {self.versions} of {self.target}")
        if self.lost:
            found.append(f"{self.lost} trajectories lost")
        if self.trained_twice:
            found.append(f"{self.trained_twice} trajectories trained twice")
        found += [f"fell back: {text}" for text in self.fallbacks]
        if self.reused_versions:
            found.append(f"version numbers naming two weights: {self.reused_versions}")
        return found

    def to_dict(self) -> dict:
        return {**asdict(self), "problems": self.problems}


def armed_run(
    work: Path,
    name: str,
    entries: list[str],
    *,
    setup: str = "embedded-native",
    bootstrap: str | None = None,
    versions: int = 12,
    minutes: float = 10.0,
    run: str | None = None,
    base: Path | None = None,
    overrides: dict | None = None,
) -> CrashRun:
    """``astraflow run`` of the math example (run name ``run``; the base checkpoint copied from ``base``,
    else warmed up as a run does) to ``versions`` with ``entries`` armed; then ``check``."""
    from astraflow.config import write_config_over

    backend, runtime = setup.split("-")
    run_dir = work / name
    run_dir.mkdir(parents=True)
    if base is not None:
        shutil.copytree(base, run_dir / "base")
    record = run_dir / "crash-record"
    record.mkdir()
    log = {"backend": "kafka", "bootstrap": bootstrap} if backend == "kafka" else {"backend": "embedded"}
    config = write_config_over(
        EXAMPLE,
        work / f"{name}.yaml",
        run=run or f"crash-{name}-{os.getpid()}",
        log=log,
        stream={"runtime": runtime},
        stop={"max_minutes": minutes, "max_versions": versions, "target_accuracy": None, "target_gain": None},
        **(overrides or {}),
    )
    env = {**os.environ, ENV: ",".join(entries), RECORD_ENV: str(record)}
    started = time.monotonic()
    with (run_dir / "launcher.out").open("wb") as out:
        launched = subprocess.run(
            [str(Path(sys.executable).with_name("astraflow")), "run", str(config), "--run-dir", str(run_dir)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=minutes * 60 + 600,
        )
    result = CrashRun(entries, setup, target=versions, seconds=time.monotonic() - started)
    result.fired = [entry for index, entry in enumerate(entries) if (record / str(index)).exists()]
    result.unreached = [entry for index, entry in enumerate(entries) if not (record / str(index)).exists()]
    if launched.returncode != 0:
        result.failure = f"astraflow run exited {launched.returncode}: {(run_dir / 'launcher.out').read_text()[-2000:]}"
        return result
    return check(run_dir, result)


def check(run_dir: Path, result: CrashRun) -> CrashRun:
    """Fill ``result`` from the records of the finished run in ``run_dir`` (module docstring)."""
    from astraflow.analysis.audit import audit_run
    from astraflow.runtime.attach import decode_snapshot, open_run
    from astraflow.schemas.records import LedgerEntry

    summary = json.loads((run_dir / "summary.json").read_text())
    result.versions = int(summary["versions"])
    result.restarts = dict(summary.get("restarts", {}))
    with open_run(run_dir) as run:
        report = audit_run(run)
        shas: dict[int, set[str]] = {}
        for topic in run.topics_of("ledger"):
            for _, entry in decode_snapshot(run.log, topic):
                if isinstance(entry, LedgerEntry):
                    shas.setdefault(entry.version, set()).add(entry.payload_sha256)
    [policy] = report.policies
    result.trajectories = policy.items
    result.lost = len(policy.lost)
    result.trained_twice = len(policy.trained_twice)
    result.fallbacks = list(policy.fallbacks)
    result.lost_versions = policy.lost_versions
    result.epochs = policy.epochs
    result.reused_versions = sorted(version for version, found in shas.items() if len(found) > 1)
    return result
