"""The prompts of a run: a jsonl file named in the config, or a generated split in the run dir.

Generated splits are written once to ``{run_dir}/data/{train,heldout}.jsonl`` so that the feeder,
the evaluator and a later replay all read the very same rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Literal

from astraflow.config import RunConfig, TaskConfig
from astraflow.core.errors import ConfigError
from astraflow.core.rundir import RunDir
from astraflow.tasks.arithmetic import ALPHABET as ARITHMETIC_ALPHABET
from astraflow.tasks.arithmetic import addition_problems, judge_problems, judge_target
from astraflow.tasks.base import Problem, read_jsonl, write_jsonl

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
    path = RunDir(run_dir).data / f"{split}.jsonl"
    if not path.is_file():
        # several components may get here at once: each writes its own file and renames it into
        # place, so a reader never sees a half-written split (they are identical by the seed)
        train, heldout = generate_split(task, RunDir(run_dir).data)
        for name, rows in (("train", train), ("heldout", heldout)):
            tmp = write_jsonl(RunDir(run_dir).data / f".{name}.{os.getpid()}.jsonl", rows)
            os.replace(tmp, RunDir(run_dir).data / f"{name}.jsonl")
    return read_jsonl(path)


def load_policy_split(config: RunConfig, run_dir: Path, split: Split, targets: bool = False) -> list[Problem]:
    """What ``config.policy`` is evaluated on: the task's rows for ``role: answer``, judging rows
    built from them (``judge_problems``, reference ``answer|candidate``) for ``role: judge``;
    with ``targets``, a judge's warm-up rows: the false claims only, carrying the sum it must write
    (``judge_target``). On a true claim that target is the candidate itself, which copying
    reproduces without computing: warmed up on both, the 4x128 judge copied 76% of false candidates
    and wrote their sum for 3% (held-out judgement accuracy 0.545); on false claims only, 21% and 35% (0.67)."""
    rows = load_task_split(config.task, run_dir, split)
    if config.role != "judge":
        return rows
    judged = judge_problems(rows, seed=config.task.seed + (split == "heldout"))
    if not targets:
        return judged
    return [
        replace(row, answer=judge_target(row.answer))
        for row in judged
        if judge_target(row.answer) != row.answer.split("|", 1)[1]
    ]


def generate_split(task: TaskConfig, data_dir: Path) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) rows of ``task.kind``, a pure function of its seed; ``search_facts`` also
    writes the corpus it is answered from (``data_dir/corpus.jsonl``)."""
    if task.kind == "search_facts":
        from astraflow.tasks.search.facts import fact_problems

        return fact_problems(task.seed, task.heldout_size, data_dir)
    if task.kind == "code_io":
        from astraflow.tasks.code.programs import program_problems

        return program_problems(task.seed, task.heldout_size)
    if task.kind == "rooms":
        from astraflow.tasks.rooms.data import room_problems

        return room_problems(task.seed, task.heldout_size)
    return addition_problems(seed=task.seed, heldout_size=task.heldout_size)


def task_data_version(kind: str) -> int:
    """The version of ``kind``'s generated problems (1 until its generator first changed); it is part
    of the base-checkpoint cache key, so a changed generator never reuses a base warmed up on the old data."""
    if kind == "code_io":
        from astraflow.tasks.code.programs import DATA_VERSION

        return DATA_VERSION
    if kind == "rooms":
        from astraflow.tasks.rooms.data import DATA_VERSION

        return DATA_VERSION
    return 1


def task_demonstration(kind: str) -> Callable[[Problem], list[str]]:
    """The policy turns of a perfect episode of a ``kind`` row (multi-turn tasks: what warm-up supervises)."""
    if kind == "search_facts":
        from astraflow.tasks.search.facts import demonstration
    elif kind == "code_io":
        from astraflow.tasks.code.programs import demonstration
    elif kind == "rooms":
        from astraflow.tasks.rooms.data import demonstration
    else:
        raise ConfigError(f"task.kind: {kind!r} is answered in one turn; it has no multi-turn demonstrations")
    return demonstration


def task_alphabet(kind: str) -> str:
    """Characters of the character-level tokenizer a tiny model for ``kind`` is built with."""
    if kind == "arithmetic":
        return ARITHMETIC_ALPHABET
    from astraflow.tasks.search.facts import ALPHABET

    return ALPHABET
