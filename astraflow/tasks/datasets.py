"""The prompts of a run: a jsonl file named in the config, or a generated split in the run dir.

Generated splits are written once to ``{run_dir}/data/{train,heldout}.jsonl`` so that the feeder,
the evaluator and a later replay all read the very same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from astraflow.config import TaskConfig
from astraflow.errors import ConfigError
from astraflow.tasks.arithmetic import Problem, addition_problems, read_jsonl, write_jsonl

Split = Literal["train", "heldout"]


def load_task_split(task: TaskConfig, run_dir: Path, split: Split) -> list[Problem]:
    """The rows of ``split``; a configured file must exist and hold at least one row."""
    configured = task.train_file if split == "train" else task.heldout_file
    if configured is not None:
        path = Path(configured)
        if not path.is_file():
            raise ConfigError(f"task.{split}_file: {path} does not exist")
        rows = read_jsonl(path)
        if not rows:
            raise ConfigError(f"task.{split}_file: {path} holds no rows")
        return rows
    path = run_dir / "data" / f"{split}.jsonl"
    if not path.is_file():
        train, heldout = addition_problems(seed=task.seed, heldout_size=task.heldout_size)
        write_jsonl(run_dir / "data" / "train.jsonl", train)
        write_jsonl(run_dir / "data" / "heldout.jsonl", heldout)
    return read_jsonl(path)
