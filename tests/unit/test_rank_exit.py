"""How a rank of a launched trainer ends (``infra/launch/ranks.run_then_exit``).

A rank that had finished could hang in the process's native teardown, and its launcher then waited for
it for ever; so a rank leaves by ``os._exit`` after its body: here a child process shows the exit status
of each way a body ends, that what it printed is flushed, and that no exit handler ran (the interpreter
was not finalised).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BODIES = {
    "returns": ("print('trained')", 0, "trained"),
    "astraflow error": ("raise ConfigError('train.lr must be positive')", 2, "error: train.lr must be positive"),
    "other error": ("raise RuntimeError('a rank broke')", 1, "RuntimeError: a rank broke"),
    "system exit": ("raise SystemExit(3)", 3, ""),
    "system exit without a status": ("raise SystemExit()", 0, ""),
    "system exit with a message": ("raise SystemExit('no agent')", 1, "no agent"),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_rank_exits_with_its_bodys_status_flushed_and_without_finalising(name: str, tmp_path: Path) -> None:
    body, status, output = BODIES[name]
    marker = tmp_path / "atexit-ran"
    program = textwrap.dedent(f"""
        import atexit, logging, pathlib
        from astraflow.core.errors import ConfigError
        from astraflow.infra.launch.ranks import run_then_exit
        logging.basicConfig()
        atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("finalised"))
        def body():
            {body}
        run_then_exit(body)
    """)
    run = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == status, run.stderr
    assert output in run.stdout + run.stderr
    assert not marker.exists()  # left by os._exit: no exit handler, no teardown
