"""``astraflow run`` with its output in a pipe (CI, nohup, a log file) reports progress as it goes.

The live dashboard needs a terminal; off one the run prints a plain line every 10 s instead. The
run is the shared math run (``math_run``), whose stdout was a pipe. On a loaded machine its
components may still be starting in the first lines, so this checks the lines and their rhythm;
``tests/unit/test_monitor.py`` checks the figures in them against the metrics.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# a cold warm-up (no cached base checkpoint) is part of the first test that needs it
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

LINE = re.compile(
    r"^\[\s*(?P<elapsed>\d+) s\] main: v(?P<version>\d+)  heldout (?:-|\d\.\d{3} \(v\d+\))  traj/s \d+"
    r"  trainer wait (?:-|\d+\.\d\d s)  lag (?:-|\d+)$"
)


def test_run_in_a_pipe_prints_a_progress_line_every_ten_seconds(math_run: Path) -> None:
    stdout = (math_run / "run.stdout").read_text()
    lines = [match for line in stdout.splitlines() if (match := LINE.match(line))]
    elapsed = [int(match["elapsed"]) for match in lines]
    first_30_s = [seconds for seconds in elapsed if seconds <= 30]
    assert len(first_30_s) >= 2, stdout[-3000:]
    rhythm = elapsed[:-1]  # the last line comes with the stop, whenever that is
    assert all(later - earlier >= 9 for earlier, later in zip(rhythm, rhythm[1:])), elapsed  # 10 s apart, rounded
    versions = [int(match["version"]) for match in lines]
    assert versions == sorted(versions) and versions[-1] > versions[0], versions  # the lines follow the run
    closing = stdout.splitlines()[-3:]  # run directory, held-out accuracy, the final model
    assert closing[1].startswith("held-out accuracy"), closing
    assert closing[2].startswith(f"final model of main: {math_run / 'final' / 'main'} (version "), closing
