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

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from astraflow.config import dump_config
from astraflow.core.rundir import RunDir
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import LedgerEntry
from astraflow.training.checkpoint import complete_checkpoints, read_state
from tests.unit.test_trainer_reference import recorded_samples
from tests.unit.tiny_trainer import tiny_math_config

REPO = Path(__file__).resolve().parents[2]
BATCH = 8
BATCHES = 5
WAIT_S = 240.0


def test_a_fenced_trainer_stops_without_writing_a_checkpoint(tmp_path: Path) -> None:
    config = tiny_math_config(tmp_path, {"run": "zombie", "train": {"checkpoint_every": 100, "batch_samples": BATCH}})
    config_path, run_dir = tmp_path / "config.yaml", tmp_path / "run"
    dump_config(config, config_path)
    ctx = ComponentContext(config, run_dir, "test")
    processes: dict[str, subprocess.Popen] = {}

    def start(name: str) -> None:
        log = (tmp_path / f"{name}.log").open("w")
        argv = [sys.executable, "-m", "astraflow.cli", "train", str(config_path), "--run-dir", str(run_dir)]
        processes[name] = subprocess.Popen(argv, cwd=REPO, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)

    def wait_for_entry(epoch: int, version: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while not any(e.epoch == epoch and e.version == version for e in ledger()):
            for name, process in processes.items():
                assert process.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no ledger entry of epoch {epoch}, version {version}"
            time.sleep(0.2)

    def ledger() -> list[LedgerEntry]:
        return [entry for _, entry in decode_snapshot(ctx.log, ctx.topics.ledger("main"))]

    try:
        for sample in recorded_samples(BATCHES * BATCH):
            key = sample.trajectory.group_id.encode()
            ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=key, partition=0)
        ctx.producer.flush()
        start("a")
        wait_for_entry(1, BATCHES)
        start("b")  # fences a, which is idle: it has trained every batch
        wait_for_entry(2, 2 * BATCHES + 1)  # b published the base as 6 and trained the batches again into 7-11
        processes["a"].send_signal(signal.SIGTERM)
        assert processes["a"].wait(timeout=WAIT_S) != 0
        assert "was fenced" in (tmp_path / "a.log").read_text()
        processes["b"].send_signal(signal.SIGTERM)
        assert processes["b"].wait(timeout=WAIT_S) == 0, (tmp_path / "b.log").read_text()[-3000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        ctx.close()
    states = [read_state(directory) for directory in complete_checkpoints(RunDir(run_dir).checkpoints("main"))]
    assert [(state.epoch, state.version) for state in states] == [(2, 2 * BATCHES + 1)]
