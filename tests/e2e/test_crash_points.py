"""A kill at a named crash point of every stage, in one run, loses nothing (``core/crashpoints.py``).

One ``astraflow run`` of the math example on the embedded log, with a point of each stage armed to
fire once (``chaos/crash_runs.py``): the feeder before its round's commit, a rollout producer before a
task's commit, the native stream before a poll's commit and inside the embedded log's SQL transaction
of one (all written, not committed), the trainer's weight publisher before its chunks are flushed and
the trainer between a checkpoint's write and its version's commit, the evaluator before its accuracy
is flushed. Each process dies by SIGKILL there, the launcher restarts it, and the run goes on to its
version target; then the records must show no trajectory lost or trained twice, no trainer resuming
behind its newest committed checkpoint, no version number naming two weights. Every point of every
stage, on both backends and runtimes, is walked by ``benchmarks/crashpoints.py``.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.chaos.crash_runs import armed_run

RUN = "crashes"


def test_a_kill_at_a_crash_point_of_every_stage_loses_nothing(warmed_run_dir: Path, tmp_path: Path) -> None:
    entries = [
        "feeder.commit#2",
        "rollout.commit#3",
        "stream.commit#3",
        f"embedded.commit_written:{RUN}.stream.main#5",
        "publish.flush_chunks:6",
        "trainer.checkpoint_written:10",
        "evaluator.flush_accuracy:5",
    ]
    result = armed_run(tmp_path, "every-stage", entries, versions=14, run=RUN, base=warmed_run_dir / "base")
    assert result.problems == [], result.to_dict()
    assert result.unreached == [], result.to_dict()  # each point was reached: its process died there
    assert {child: count >= 1 for child, count in result.restarts.items()} == {
        child: True for child in ("feed", "rollout-0", "stream", "train", "evaluate")
    }, result.restarts
    assert result.epochs >= 3 and result.trajectories > 0  # the trainer started thrice; work was done
