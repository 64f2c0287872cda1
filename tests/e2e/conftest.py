"""End-to-end fixtures: a warmed-up base checkpoint shared by every e2e test, and run configs.

The base checkpoint is built once by ``astraflow warmup`` (a real subprocess) and cached under
``ASTRAFLOW_CACHE`` like a user's would be, so the e2e tests pay the warm-up at most once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from astraflow.config import write_config_over

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"
ASTRAFLOW = Path(sys.executable).with_name("astraflow")


def write_config(path: Path, **sections: dict) -> Path:
    """The example config with ``sections`` merged over it, written to ``path``."""
    return write_config_over(EXAMPLE, path, **sections)


@contextmanager
def made_once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """The directory ``name`` of this test session, made by one process: under pytest-xdist each
    worker asks, the first makes it while it holds a lock, the others wait and reuse it (a session
    fixture is otherwise made once per worker). Yields the directory and whether it is already
    made; it counts as made once the body ends without an exception (a failed attempt is removed
    and the next worker tries again)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = done.exists()
        if not made:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
        yield directory, made
        done.touch()


@pytest.fixture(scope="session")
def warmed_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory template holding ``base/``, the warmed-up checkpoint."""
    with made_once(tmp_path_factory, "warm") as (run_dir, made):
        if not made:
            warm_up(write_config(run_dir / "config.yaml"), run_dir, timeout=1700)
    assert (run_dir / "base" / "config.json").is_file()
    return run_dir


def warm_up(config: Path, run_dir: Path, timeout: float) -> None:
    """``astraflow warmup`` of ``config`` into ``run_dir/base`` (a real subprocess), which must succeed."""
    result = subprocess.run(
        [str(ASTRAFLOW), "warmup", str(config), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def run_to_end(config: Path, run_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    """``astraflow run CONFIG --run-dir RUN_DIR --no-dashboard`` (a real subprocess), asserted to end with 0."""
    argv = [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def run_audit(*target: Path) -> subprocess.CompletedProcess:
    """``astraflow audit TARGET... --json`` (a real subprocess: a run directory, or a config and
    ``--run-dir``); its JSON report is the output."""
    argv = [str(ASTRAFLOW), "audit", *map(str, target), "--json"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.fixture
def run_dir(warmed_run_dir: Path, tmp_path: Path) -> Path:
    """A fresh run directory that starts from the shared base checkpoint."""
    target = tmp_path / "run"
    target.mkdir()
    shutil.copytree(warmed_run_dir / "base", target / "base")
    return target


@pytest.fixture(scope="session")
def math_run(warmed_run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of one finished ``astraflow run`` of the math example (80 versions, ~1.7
    minutes on 2 quiet cores), shared by the tests that check it learned, those that use its
    logged topics (replay) and the one that reads what it printed into a pipe (``run.stdout``).
    Its weights are signed: the trainer signs with ``keys/weights-signing.pem`` (made by
    ``astraflow keys generate``), every reader verifies with the public key.
    Bounded by versions, not minutes, so a loaded machine is only slower."""
    with made_once(tmp_path_factory, "math-run") as (run_dir, made):
        if not made:
            record_math_run(warmed_run_dir, run_dir)
    return run_dir


def record_math_run(warmed_run_dir: Path, run_dir: Path) -> None:
    shutil.copytree(warmed_run_dir / "base", run_dir / "base")
    keys = subprocess.run(
        [str(ASTRAFLOW), "keys", "generate", str(run_dir / "keys")], capture_output=True, text=True, timeout=120
    )
    assert keys.returncode == 0, keys.stderr[-2000:]
    signing = {"signing_key": str(run_dir / "keys" / "weights-signing.pem")}
    signing["verify_key"] = str(run_dir / "keys" / "weights-signing.pub.pem")
    config = write_config(
        run_dir / "test.yaml", run="learn", stop={"max_versions": 80, "max_minutes": 12}, weights=signing
    )
    result = run_to_end(config, run_dir, timeout=900)
    (run_dir / "run.stdout").write_text(result.stdout)


def stop_processes(processes: Iterable[subprocess.Popen], timeout: float = 60) -> None:
    """SIGTERM every process still running, then wait for each; kill any that outlives ``timeout``."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
