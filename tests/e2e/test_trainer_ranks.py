"""The math job with a trainer of two ranks (``train.world_size: 2``, DDP on gloo) and two stream
processor instances (``stream.instances: 2``) learns, and survives the SIGKILL of a rank; so does
one of two DeepSpeed ZeRO-3 ranks (a long test: ``pytest -m long``), whose restart resumes from a
checkpoint in DeepSpeed's format through its universal conversion.

``astraflow run`` starts the trainer under ``torch.distributed.run``; rank 0 reads the samples and
writes the log, rank 1 trains its half of every batch. Mid-run rank 1 is killed: the elastic agent
ends rank 0 too and restarts both, which resume from the last checkpoint (``checkpoint_every: 1``)
as a restarted trainer does. Later rank 0 kills itself at the named crash point between the ranks'
shards of a checkpoint and its commit (``trainer.sharded_checkpoint_commit``, ``core/crashpoints.py``),
and the ranks restart from the checkpoint before it. Afterwards every trajectory has one fate
(``astraflow audit``: none lost, none trained twice, no restart behind the newest committed
checkpoint), only rank 0 wrote metrics, both stream instances emitted groups (one partition each), and
the held-out score rose.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from astraflow.core.crashpoints import ENV as CRASH_ENV
from astraflow.core.crashpoints import RECORD_ENV
from astraflow.infra.launch.monitor import gain_over_base
from tests.e2e.conftest import ASTRAFLOW, run_audit, stop_processes, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

MAX_VERSIONS = 35
"""The run stops here; its last two evaluations are at 30 and 35. At 25 versions (the lr still warming
up over 30) a CI run of the DDP trainer scored 0.38, 0.38, 0.45, 0.53, 0.415, 0.43 at versions 0-25: it
learned, fell back at 20, and the mean of the last two missed the margin (+0.0425)."""
KILL_AT = 6
"""The version after which rank 1 is killed: checkpointed, and far enough before the last evaluations."""
CRASH_AT = 12
"""The version at whose checkpoint rank 0 kills itself, its shards written and not committed."""
MARGIN = 0.05
"""Gain of the mean of the last two held-out evaluations over the base, as ``test_faults.py`` asks of a
run with faults. Two clean runs of the main job (one rank) scored a mean of +0.0975 and +0.065 at versions
20 and 25, both dipping at 20, and +0.14 and +0.15 at 30 and 35; the mean of two evaluations of 200
prompts varies by ~0.025."""


def trainer_version(run_dir: Path) -> int:
    """The newest version the trainer logged (``version N: loss ...`` in its output)."""
    text = (
        (run_dir / "logs" / "train.out").read_text(errors="replace")
        if (run_dir / "logs" / "train.out").exists()
        else ""
    )
    versions = [int(line.split("version ", 1)[1].split(":", 1)[0]) for line in text.splitlines() if ": loss " in line]
    return max(versions, default=0)


def train_tail(run_dir: Path) -> str:
    """The end of the trainer's output (agent and ranks), for an assertion's message."""
    return (run_dir / "logs" / "train.out").read_text(errors="replace")[-4000:]


def rank_pid(run_dir: Path, rank: int) -> int:
    """The pid of the newest process of trainer rank ``rank`` (its log file is named after it)."""
    logs = sorted((run_dir / "logs").glob(f"train-rank{rank}-*.log"), key=lambda path: path.stat().st_mtime)
    assert logs, list((run_dir / "logs").iterdir())
    return int(logs[-1].stem.rsplit("-", 1)[1])


BACKENDS = {
    "ddp": {"checkpoint_every": 1},
    "zero3": {"backend": "deepspeed", "deepspeed": {"zero_stage": 3}, "checkpoint_every": 2},
}
"""``train`` settings of each trainer tested; ZeRO-3 checkpoints every other version, so its restart
also retrains versions it had published but not checkpointed."""


@pytest.mark.parametrize("backend", [pytest.param("ddp"), pytest.param("zero3", marks=pytest.mark.long)])
def test_two_rank_trainer_learns_and_survives_a_killed_rank(run_dir: Path, backend: str) -> None:
    config = write_config(
        run_dir / "test.yaml",
        run="ranks",
        train={"world_size": 2, "threads": 1, **BACKENDS[backend]},
        stream={"instances": 2},
        eval={"every_versions": 5},
        stop={"max_minutes": 12, "max_versions": MAX_VERSIONS, "target_accuracy": None},
    )
    record = run_dir / "crash-record"
    record.mkdir()
    crash = {CRASH_ENV: f"trainer.sharded_checkpoint_commit:{CRASH_AT}", RECORD_ENV: str(record)}
    with (run_dir / "launcher.out").open("wb") as out:
        launcher = subprocess.Popen(
            [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **crash},
        )
    try:
        deadline = time.monotonic() + 600
        while trainer_version(run_dir) < KILL_AT and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = rank_pid(run_dir, 1)
        os.kill(killed, signal.SIGKILL)
        launcher.wait(timeout=900)
    finally:
        stop_processes([launcher])
    assert launcher.returncode == 0, (run_dir / "launcher.out").read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["versions"] >= MAX_VERSIONS, (summary, train_tail(run_dir))
    # the elastic agent restarted the ranks: a new rank 1 trained after the killed one
    assert rank_pid(run_dir, 1) != killed
    assert (record / "0").exists(), "rank 0 never reached the sharded checkpoint's commit"
    report = json.loads(run_audit(run_dir).stdout)
    [policy] = report["policies"]
    assert report["ok"] and not policy["lost"] and not policy["trained_twice"], report
    # rank 0 alone wrote to the log: the trainer's metrics come from one process per start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    writers = {row["labels"]["instance"] for row in rows if row["component"] == "train"}
    rank0_pids = {path.stem.rsplit("-", 1)[1] for path in (run_dir / "logs").glob("train-[0-9]*.log")}
    assert {writer.rsplit("-", 1)[1] for writer in writers} <= rank0_pids, (writers, rank0_pids)
    # the two stream instances each accepted groups: the trajectories partitions were shared
    streams = {row["component"] for row in rows if row["name"] == "stream.accepted_groups"}
    assert streams == {"stream", "stream-1"}, streams
    accuracy = {int(version): value for version, value in summary["accuracy_by_version"].items()}
    assert gain_over_base(accuracy) >= MARGIN, summary
