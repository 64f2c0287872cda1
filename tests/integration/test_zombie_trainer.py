"""A fenced trainer writes nothing at its stop (Reliability IV, scenario 6).

Two real ``astraflow train`` processes of one policy on the embedded log (tiny model, recorded
samples, ``checkpoint_every: 100`` so that only stops checkpoint). A trains the five batches into
versions 1-5 and waits for more. B starts, which fences A, and trains the same batches again into
new versions. Then A is stopped (SIGTERM): it used to write its stop checkpoint of version 5 - a
checkpoint the ledger names, of a lineage B had left, which a later restart could restore. Now its
probe transaction learns it was fenced and it exits without writing one; B's stop checkpoint is the
only one.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from astraflow.core.rundir import RunDir
from astraflow.training.checkpoint import complete_checkpoints, read_state
from tests.integration.test_trainer_ledger import ledger
from tests.integration.trainer_processes import TrainerRun
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import send_samples

BATCH = 8
BATCHES = 5
WAIT_S = 240.0


def test_a_fenced_trainer_stops_without_writing_a_checkpoint(tmp_path: Path) -> None:
    run = TrainerRun(tmp_path, {"run": "zombie", "train": {"checkpoint_every": 100, "batch_samples": BATCH}})

    def wait_for_entry(epoch: int, version: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while not any(e.epoch == epoch and e.version == version for e in ledger(run.ctx)):
            for name, process in run.processes.items():
                assert process.poll() is None, run.output(name)
            assert time.monotonic() < deadline, f"no ledger entry of epoch {epoch}, version {version}"
            time.sleep(0.2)

    try:
        send_samples(run.ctx, recorded_samples(BATCHES * BATCH))
        run.start("a")
        wait_for_entry(1, BATCHES)
        run.start("b")  # fences a, which is idle: it has trained every batch
        wait_for_entry(2, 2 * BATCHES + 1)  # b published the base as 6 and trained the batches again into 7-11
        run.processes["a"].send_signal(signal.SIGTERM)
        assert run.processes["a"].wait(timeout=WAIT_S) != 0
        assert "was fenced" in run.output("a")
        run.processes["b"].send_signal(signal.SIGTERM)
        assert run.processes["b"].wait(timeout=WAIT_S) == 0, run.output("b")
    finally:
        run.close()
    states = [read_state(directory) for directory in complete_checkpoints(RunDir(run.run_dir).checkpoints("main"))]
    assert [(state.epoch, state.version) for state in states] == [(2, 2 * BATCHES + 1)]
