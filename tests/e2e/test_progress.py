"""``astraflow run`` with its output in a pipe (CI, nohup, a log file) reports progress as it goes.

The live dashboard needs a terminal; off one the run prints a plain line every 10 s instead. The
run is the math example cut to 36 s by ``--max-minutes``: it stops on time, whatever it printed.
On a loaded machine its components may still be starting then, so this checks the lines and their
rhythm; ``tests/unit/test_monitor.py`` checks the figures in them against the metrics.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import ASTRAFLOW, write_config

# a cold warm-up (no cached base checkpoint) is part of the first test that needs it
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

LINE = re.compile(
    r"^\[\s*(?P<elapsed>\d+) s\] main: v\d+  heldout (?:-|\d\.\d{3} \(v\d+\))  traj/s \d+"
    r"  trainer wait (?:-|\d+\.\d\d s)  lag (?:-|\d+)$"
)


def test_run_in_a_pipe_prints_a_progress_line_every_ten_seconds(run_dir: Path) -> None:
    config = write_config(run_dir / "test.yaml", run="progress")
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--max-minutes", "0.6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    elapsed = [int(match["elapsed"]) for line in result.stdout.splitlines() if (match := LINE.match(line))]
    first_30_s = [seconds for seconds in elapsed if seconds <= 30]
    assert len(first_30_s) >= 2, result.stdout[-3000:]
    assert first_30_s[1] - first_30_s[0] >= 9, elapsed  # 10 s apart, each rounded to the second
    closing = result.stdout.splitlines()[-3:]  # run directory, held-out accuracy, the final model
    assert closing[1].startswith("held-out accuracy"), closing
    assert closing[2].startswith(f"final model of main: {run_dir / 'final' / 'main'} (version "), closing
