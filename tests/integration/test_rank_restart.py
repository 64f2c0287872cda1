"""The ranks of a trainer restarted by the launcher form their group again, whatever order they start in.

The launcher's store outlives a start of the ranks; a group formed on it directly found the dead
ranks' addresses there after a restart, and a rank that read them before its peer rewrote them failed
(``Gloo connectFullMesh failed ... Connection refused``): the CI run's two-rank trainer never trained
again after a rank was killed. ``rank_restart.py`` forces that order: on the restart rank 0 joins
late. The group must form on the restart and the all-reduce give 1 + 2 on both starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).with_name("rank_restart.py")


def test_a_restarted_group_forms_again_when_rank_0_joins_late() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1"]
        + ["--standalone", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for start in (0, 1):
        for rank in (0, 1):
            assert f"start {start} rank {rank} sum 3" in result.stdout, output[-4000:]
