"""What a result file records about the run that made it, so that a figure can say when it was measured.

``begin()`` before the measurement and ``finish(record)`` after give the fields every result file
should carry: the commit it ran at (``git describe --always --dirty``; a dirty tree also records the
sha256 of its diff, so the exact code can be told), the exact command, the sha256 of the config it
used and of ``uv.lock``, and the machine's load average before and after (two shared cores make
every time noisy: the load says how noisy).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from staleness import git

REPO = Path(__file__).resolve().parents[1]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def begin(config: Path | None = None) -> dict:
    """The provenance of a run about to start (``config``: the config file it uses, if any)."""
    commit = git("describe", "--always", "--dirty", "--abbrev=12")
    record = {
        "commit": commit,
        "command": [Path(sys.executable).name, *sys.argv],
        "config_sha256": sha256_of(config) if config is not None else None,
        "uv_lock_sha256": sha256_of(REPO / "uv.lock"),
        "load_before": list(os.getloadavg()),
    }
    if commit.endswith("-dirty"):
        record["diff_sha256"] = hashlib.sha256(git("diff", "HEAD").encode()).hexdigest()
    return record


def finish(record: dict) -> dict:
    """``record`` with the load average after the run."""
    return {**record, "load_after": list(os.getloadavg())}
