"""Every committed benchmark result declares the paths its figures depend on (``benchmarks/staleness.py``),
so the staleness table the test suite prints covers all of them; and every benchmark that writes a result
records its provenance (``benchmarks/provenance.py``), so that a new benchmark cannot forget to say what it
ran at."""

from __future__ import annotations

import ast
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


def test_provenance_commit_is_preferred_to_a_bare_one_and_old_results_still_count() -> None:
    result = {
        "provenance": {"commit": "abc123def456-dirty", "command": ["python", "x.py"]},
        "commit": "0ld0000",
        "runs": [{"commit": "def5678+dirty"}, {"provenance": {"commit": "fedcba987654"}, "commit": "0ld1111"}],
    }
    assert staleness.recorded_commits(result) == ["abc123def456", "def5678", "fedcba987654"]


WRITE_CALLS = {"write_text", "write_bytes", "dump"}
"""Calls that write a file (``Path.write_text`` / ``write_bytes``, ``json.dump``; ``open`` in a write
mode is checked apart)."""


def _writes_results(tree: ast.Module) -> bool:
    """Whether a script writes under ``benchmarks/results``: it names the ``results`` folder (its
    ``RESULTS`` constant) and writes a file. A reader such as ``staleness.py`` names it and writes none."""
    names_results = any(isinstance(n, ast.Constant) and n.value == "results" for n in ast.walk(tree))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    writes = any(isinstance(c.func, ast.Attribute) and c.func.attr in WRITE_CALLS for c in calls) or any(
        isinstance(c.func, ast.Name) and c.func.id == "open" and set(_open_mode(c)) & set("wax+") for c in calls
    )
    return names_results and writes


def _open_mode(call: ast.Call) -> str:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else ""


def _called(tree: ast.Module, name: str) -> bool:
    """``name(...)`` after ``from provenance import name``, or ``provenance.name(...)``."""
    imported = any(
        isinstance(n, ast.ImportFrom) and n.module == "provenance" and any(a.name == name for a in n.names)
        for n in ast.walk(tree)
    )
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if imported and isinstance(call.func, ast.Name) and call.func.id == name:
            return True
        if (
            isinstance(call.func, ast.Attribute)
            and call.func.attr == name
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "provenance"
        ):
            return True
    return False


def test_every_benchmark_writing_a_result_records_its_provenance() -> None:
    scripts = {path.name: ast.parse(path.read_text()) for path in sorted((REPO / "benchmarks").glob("*.py"))}
    writers = {name for name, tree in scripts.items() if _writes_results(tree)}
    # each committed result's script (the first benchmarks/*.py among its paths) is found as a writer,
    # so the check below cannot pass by finding none
    producers = {
        next(Path(p).name for p in paths if p.startswith("benchmarks/") and p.endswith(".py"))
        for paths in staleness.DEPENDS.values()
    }
    assert producers <= writers
    missing = {
        name: [call for call in ("begin", "finish") if not _called(scripts[name], call)]
        for name in sorted(writers)
        if not (_called(scripts[name], "begin") and _called(scripts[name], "finish"))
    }
    assert missing == {}, "call provenance.begin() before measuring and finish() into the result"
    unkeyed = [
        name
        for name in sorted(writers)
        if not any(isinstance(n, ast.Constant) and n.value == "provenance" for n in ast.walk(scripts[name]))
    ]
    assert unkeyed == [], "record finish(record) in the result under the key 'provenance'"
