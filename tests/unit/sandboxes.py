"""What the sandbox test files share: small limits, and a backend that works here or a clear refusal.

A backend that does not work here is skipped with the probe's reason, except under ``CI=true``,
where it fails: ``make test`` installs bubblewrap, so a CI machine has both backends.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from astraflow.sandbox import BACKENDS, Sandbox, SandboxLimits, probe

LIMITS = SandboxLimits(
    wall_seconds=2.0, cpu_seconds=1, memory_mb=128, max_processes=8, max_file_mb=1, max_output_bytes=4096
)


def working(name: str) -> Sandbox:
    """Backend ``name`` with ``LIMITS`` once its probe passes; skip (fail under ``CI=true``) otherwise."""
    box = BACKENDS[name](LIMITS)
    problem = probe(box)
    if problem is not None:
        message = f"{name} does not work here: {problem}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return box


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids
