"""Named crash points: places where a test can have a component process die, as ``kill -9`` would.

A guarantee about crashes is worth what the crashes it was tested with were worth: a kill by timer
lands wherever it lands and mostly misses the narrow windows (between a checkpoint's write and its
version's commit, say). So every step of a stage whose interruption matters - each call of
``commit``, ``send_offsets``, ``flush``, ``fsync``, ``rename`` and ``rmtree`` in the modules of
``STAGE_MODULES`` - is preceded by ``crash_point(NAME, at)``, and ``find_crash_points`` finds them
all from the code (``tests/unit/test_crashpoints.py`` fails on a call without one, so a new step
cannot be forgotten). A test arms points from outside the process with the environment variable
``ASTRAFLOW_CRASH_AT``, a comma-separated list of entries:

- ``NAME`` kills the process the first time it passes ``NAME``;
- ``NAME:AT`` when it passes ``NAME`` with ``at`` equal to ``AT`` (e.g. the version);
- ``NAME#N`` the ``N``-th time this process passes ``NAME`` (``NAME:AT#N`` both);
- any of these with ``!enospc`` appended raises ``OSError(ENOSPC)`` there instead of killing: the
  disk filled up under the step (a checkpoint's write fails; the process goes on as its code says).

With ``ASTRAFLOW_CRASH_RECORD`` set to a directory, each entry fires once across restarts: firing
creates ``DIR/<index>`` first, and an entry whose file exists is spent. So ``trainer.commit#2`` kills
one trainer once, and ``trainer.commit#2,trainer.commit#2`` kills it twice in a row at the same point;
entries are independent, so one run can arm a point in every stage. Without the directory an entry
fires every time it matches (a restarted process dies again).

The process sends itself SIGKILL: no exception unwinds, no ``finally`` runs, no buffer is flushed,
nothing is closed. Unarmed (the variable unset, as in every run), a crash point costs one dict
lookup.
"""

from __future__ import annotations

import ast
import errno
import logging
import os
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ENV = "ASTRAFLOW_CRASH_AT"
RECORD_ENV = "ASTRAFLOW_CRASH_RECORD"

STAGE_MODULES = (
    "producers/feeder/component.py",
    "producers/rollout/component.py",
    "producers/rollout/task_batches.py",
    "streams/runtimes/native.py",
    "streams/runtimes/faust_runtime.py",
    "streams/runtimes/faust_consumer.py",
    "consumers/trainer/component.py",
    "consumers/trainer/seals.py",
    "weights/publish.py",
    "consumers/evaluators/policy.py",
    "consumers/evaluators/system.py",
    "training/checkpoint.py",
    "log/embedded/transactions.py",
    "log/embedded/consumer.py",
)
"""The modules whose durable steps are crash points, under ``astraflow/``: every stage's process (feeder,
rollout producer, both stream runtimes, the trainer of one or several ranks and its checkpoints, the
weight publisher, the evaluators) and the embedded log's commit path."""
CRASH_CALLS = frozenset({"commit", "send_offsets", "flush", "fsync", "rename", "rmtree"})
"""The calls that make a step durable or visible: each must follow a crash point."""
MODULE_CALLS = {"log/embedded/transactions.py": frozenset({"write"}), "log/embedded/consumer.py": frozenset({"write"})}
"""More such calls in one module: the embedded log commits with its store's ``write`` (one SQLite transaction)."""

logger = logging.getLogger(__name__)
_passes: Counter[str] = Counter()


def crash_point(name: str, at: object = None) -> None:
    """Die here by SIGKILL if ``ASTRAFLOW_CRASH_AT`` has an unspent entry for this point, or raise the
    entry's fault (``!enospc``) (module docstring)."""
    armed = os.environ.get(ENV)
    if not armed:
        return
    _passes[name] += 1
    for index, entry in enumerate(armed.split(",")):
        entry, _, fault = entry.strip().partition("!")
        if fault not in ("", "enospc"):
            raise ValueError(f"{ENV}: unknown fault {fault!r} in {entry!r}!{fault} (known: enospc)")
        point, _, count = entry.partition("#")
        point, _, value = point.partition(":")
        if point != name or (value and value != str(at)) or (count and int(count) != _passes[name]):
            continue
        if not _spend(index):
            continue
        if fault == "enospc":
            logger.warning("crash point %s%s armed: the disk is full here (ENOSPC)", name, f" at {at}" if value else "")
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (crash point {name})")
        logger.warning("crash point %s%s armed: killing this process (SIGKILL)", name, f" at {at}" if value else "")
        for handler in logging.getLogger().handlers:
            handler.flush()  # the warning is the test's evidence that the kill landed here; nothing else is flushed
        os.kill(os.getpid(), signal.SIGKILL)


def _spend(index: int) -> bool:
    """Whether entry ``index`` may fire now (and, with ``ASTRAFLOW_CRASH_RECORD``, mark it spent)."""
    record = os.environ.get(RECORD_ENV)
    if not record:
        return True
    try:
        descriptor = os.open(Path(record) / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.close(descriptor)
    return True


@dataclass(frozen=True)
class CrashSite:
    """One durable call in a stage module, and the crash point before it (``None``: none, a gap)."""

    module: str
    line: int
    call: str
    point: str | None


PACKAGE = Path(__file__).resolve().parents[1]


def find_crash_points(package: Path = PACKAGE, modules: tuple[str, ...] = STAGE_MODULES) -> list[CrashSite]:
    """Every call of ``CRASH_CALLS`` (and ``MODULE_CALLS``) in ``modules`` of ``package``, with the crash
    point of the statement before it in the same block (``None``: a gap)."""
    root = package
    sites: list[CrashSite] = []
    for module in modules:
        tree = ast.parse((root / module).read_text(), filename=module)
        for node in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                previous: str | None = None
                for statement in block:
                    for call in _crash_calls(statement, CRASH_CALLS | MODULE_CALLS.get(module, frozenset())):
                        sites.append(CrashSite(module, call.lineno, _call_name(call), previous))
                    previous = _point_name(statement)
    return sorted(set(sites), key=lambda site: (site.module, site.line, site.call))


def crash_point_names(package: Path = PACKAGE) -> list[tuple[str, str, int]]:
    """(name, module, line) of every ``crash_point`` call with a literal name anywhere in ``package``:
    the points a harness can arm, the durable sites' and the few placed by hand (a window between
    two steps, e.g. ``trainer.checkpoint_written``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = _point_name(ast.Expr(node)) if isinstance(node, ast.Call) else None
            if name is not None:
                found.append((name, str(path.relative_to(package)), node.lineno))
    return found


def _crash_calls(statement: ast.AST, names: frozenset[str]) -> list[ast.Call]:
    """The durable calls of ``statement`` itself, not of the blocks nested in it (visited as blocks)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    if isinstance(statement, (ast.If, ast.While)):
        heads: list[ast.AST] = [statement.test]
    elif isinstance(statement, (ast.For, ast.AsyncFor)):
        heads = [statement.iter]
    elif isinstance(statement, (ast.With, ast.AsyncWith)):
        heads = [item.context_expr for item in statement.items]
    elif isinstance(statement, ast.Try):
        heads = []
    else:
        heads = [statement]
    calls = [node for head in heads for node in ast.walk(head) if isinstance(node, ast.Call)]
    return [call for call in calls if _call_name(call) in names]


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _point_name(statement: ast.AST) -> str | None:
    """The name of the crash point ``statement`` is (``crash_point("name", ...)``), or ``None``."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        call = statement.value
        if _call_name(call) == "crash_point" and call.args and isinstance(call.args[0], ast.Constant):
            return str(call.args[0].value)
    return None
