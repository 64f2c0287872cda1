"""A trainer killed twice in the window between a checkpoint's write and its version's commit never
falls back behind its newest committed checkpoint (Reliability IV, scenario 1).

Real ``astraflow train`` processes on the embedded log, the math example's config over a tiny model
with its own ``checkpoint_every: 10``, fed recorded samples. Each dies by SIGKILL at the named crash
point ``trainer.checkpoint_written`` (``astraflow.core.crashpoints``), armed from outside:

1. the first trainer commits versions 1-39 (checkpoints 10, 20, 30) and dies once checkpoint 40 is on
   disk, before version 40 commits: the ledger never names it;
2. the second restores 30, publishes it as version 40 and trains 41-49, and dies once checkpoint 50
   is on disk. Retention used to keep the two newest directories whatever the ledger named (40 and
   50, neither named) and so deleted 30;
3. the third must restore 30 again: its start entry's parent is (epoch 1, version 30), not the base,
   and ``astraflow audit``'s fall-back check finds nothing (it finds the base start of before).

A full disk under a checkpoint's write (``checkpoint.fsync_file:20!enospc``: ``OSError(ENOSPC)`` there)
ends the trainer with that error, its half-written checkpoint left on disk; the restarted trainer
removes it and resumes from the last committed checkpoint, as after a kill.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from astraflow.analysis.audit import fallbacks
from astraflow.core.rundir import RunDir
from astraflow.schemas.records import LedgerEntry
from tests.integration.test_trainer_ledger import ledger
from tests.integration.trainer_processes import TrainerRun
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import send_samples

BATCH = 8
WAIT_S = 240.0


def run_to_a_step(run: TrainerRun, name: str, epoch: int) -> None:
    """Start trainer ``name`` unarmed, wait until it (trainer ``epoch``) committed a step, and stop it."""
    trainer = run.start(name)
    deadline = time.monotonic() + WAIT_S
    try:
        while not any(e.epoch == epoch and e.kind == "step" for e in ledger(run.ctx)):
            assert trainer.poll() is None, run.output(name)
            assert time.monotonic() < deadline, f"the {name} trainer published no step"
            time.sleep(0.2)
    finally:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(timeout=WAIT_S)


def test_two_kills_between_checkpoint_and_commit_resume_from_the_last_committed_checkpoint(tmp_path: Path) -> None:
    run = TrainerRun(tmp_path, {"run": "fallback", "train": {"checkpoint_every": 10, "batch_samples": BATCH}})
    ctx = run.ctx
    try:
        send_samples(ctx, recorded_samples(70 * BATCH))
        for name, point in (("first", "trainer.checkpoint_written:40"), ("second", "trainer.checkpoint_written:50")):
            assert run.start(name, point).wait(timeout=WAIT_S) == -signal.SIGKILL, run.output(name)
        entries = ledger(ctx)
        assert max(e.version for e in entries if e.epoch == 1) == 39  # version 40 never committed
        assert max(e.version for e in entries if e.epoch == 2) == 49
        assert "v00000030" in {p.name for p in RunDir(run.run_dir).checkpoints("main").glob("v*")}

        run_to_a_step(run, "third", epoch=3)
        entries = ledger(ctx)
        (start,) = [e for e in entries if e.epoch == 3 and e.kind == "start"]
        assert (start.parent_epoch, start.parent_version) == (1, 30)
        assert start.version == 50  # the next unused id: no version number names two weights
        assert fallbacks(entries, 10) == []
    finally:
        run.close()


def test_a_full_disk_under_a_checkpoint_ends_the_trainer_with_the_error_and_the_restart_resumes(
    tmp_path: Path,
) -> None:
    run = TrainerRun(tmp_path, {"run": "fulldisk", "train": {"checkpoint_every": 10, "batch_samples": BATCH}})
    ctx = run.ctx
    checkpoints = RunDir(run.run_dir).checkpoints("main")
    try:
        send_samples(ctx, recorded_samples(40 * BATCH))
        code = run.start("full", "checkpoint.fsync_file:20!enospc").wait(timeout=WAIT_S)
        assert code not in (0, -signal.SIGKILL), (code, run.output("full"))
        assert "No space left on device" in run.output("full")
        assert "v00000020.tmp" in {p.name for p in checkpoints.glob("v*")}  # what the full disk left
        assert max(e.version for e in ledger(ctx)) == 19

        run_to_a_step(run, "second", epoch=2)
        entries = ledger(ctx)
        (start,) = [e for e in entries if e.epoch == 2 and e.kind == "start"]
        assert (start.parent_epoch, start.parent_version, start.version) == (1, 10, 20)
        assert "v00000020.tmp" not in {p.name for p in checkpoints.glob("v*")}
        assert fallbacks(entries, 10) == []
    finally:
        run.close()


def test_the_audit_reports_a_fall_back_to_the_base_as_a_failure() -> None:
    """The audit's check itself, on the ledger the bug left: epoch 3 started from the base."""

    def entry(epoch: int, kind: str, version: int, parent: tuple[int, int]) -> LedgerEntry:
        return LedgerEntry("main", kind, epoch, version, *parent, [], [], {}, "", 0, 0)

    first = [entry(1, "start", 0, (-1, -1))] + [entry(1, "step", v, (1, v - 1)) for v in range(1, 40)]
    second = [entry(2, "start", 40, (1, 30))] + [entry(2, "step", v, (2, v - 1)) for v in range(41, 50)]
    assert fallbacks(first + second, 10) == []
    assert fallbacks(first + second + [entry(3, "start", 50, (1, 30))], 10) == []
    (found,) = fallbacks(first + second + [entry(3, "start", 50, (-1, -1))], 10)
    assert "epoch 3 resumed from the base, 39 steps behind version 49" in found
