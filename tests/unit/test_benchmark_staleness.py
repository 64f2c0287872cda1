"""Every committed benchmark result declares the paths its figures depend on (``benchmarks/staleness.py``),
so the staleness table the test suite prints covers all of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import staleness

REPO = Path(__file__).resolve().parents[2]


def test_every_result_file_declares_existing_paths() -> None:
    results = {path.name for path in (REPO / "benchmarks" / "results").glob("*.json")}
    assert set(staleness.DEPENDS) == results
    missing = [p for paths in staleness.DEPENDS.values() for p in paths if not (REPO / p).exists()]
    assert missing == []


def test_a_commit_on_a_declared_path_counts_and_one_elsewhere_does_not(tmp_path: Path) -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert staleness.changes_since(head, ["astraflow"]) == 0
    assert staleness.recorded_commits({"runs": [{"commit": "abc1234+dirty"}, {"x": 1}], "commit": "def5678"}) == [
        "def5678",
        "abc1234",
    ]
