"""Real ``astraflow train`` processes of one run, for the tests that kill, fence or stop them.

``TrainerRun`` writes the config (the math example over a tiny model, ``tiny_math_config``), opens the
run's context for the test to read and write the log with, and starts trainer processes, each logging
to ``<name>.log``, optionally armed with a crash point (``astraflow.core.crashpoints``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from astraflow.config import dump_config
from astraflow.core.crashpoints import ENV
from astraflow.runtime.context import ComponentContext
from tests.unit.tiny_trainer import tiny_math_config

REPO = Path(__file__).resolve().parents[2]


class TrainerRun:
    def __init__(self, tmp_path: Path, overrides: dict) -> None:
        self.tmp_path = tmp_path
        self.config_path, self.run_dir = tmp_path / "config.yaml", tmp_path / "run"
        config = tiny_math_config(tmp_path, overrides)
        dump_config(config, self.config_path)
        self.ctx = ComponentContext(config, self.run_dir, "test")
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, crash_at: str | None = None) -> subprocess.Popen:
        """A trainer process named ``name``; with ``crash_at`` it SIGKILLs itself at that crash point."""
        env = {key: value for key, value in os.environ.items() if key != ENV}
        if crash_at:
            env[ENV] = crash_at
        log = (self.tmp_path / f"{name}.log").open("w")
        argv = [sys.executable, "-m", "astraflow.cli", "train", str(self.config_path), "--run-dir", str(self.run_dir)]
        self.processes[name] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self.processes[name]

    def output(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()[-3000:]

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        self.ctx.close()
