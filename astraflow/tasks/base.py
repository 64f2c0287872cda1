"""What every task domain shares: a ``Problem`` (a prompt and its reference) and its jsonl files.

A split is a jsonl file with one ``{"prompt_id", "prompt", "answer"}`` object per line: the format
``task.train_path`` / ``task.heldout_path`` name, and what the generated splits are written as.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer."""

    prompt_id: str
    prompt: str
    answer: str


def write_jsonl(path: str | Path, problems: Iterable[Problem]) -> Path:
    """Write one problem per line; returns ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", encoding="utf-8") as handle:
        for problem in problems:
            handle.write(json.dumps(asdict(problem)) + "\n")
    return target


def read_jsonl(path: str | Path) -> list[Problem]:
    """The problems written by ``write_jsonl``."""
    with Path(path).open(encoding="utf-8") as handle:
        return [Problem(**json.loads(line)) for line in handle if line.strip()]
