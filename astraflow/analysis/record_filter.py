"""Record filters for ``astraflow tail``: ``--policy``, ``--min-version`` and ``--where``.

``--where`` takes ``FIELD OP NUMBER`` (e.g. ``reward>0``, ``reward_components.correct >= 1``,
``trajectory.reward<0.5`` on train samples). It is matched by one regular expression and compared
in Python, never evaluated: FIELD is a dotted path of record fields (and map keys; ``min_version``
of a trajectory works too), OP one of ``> >= < <= == !=``, NUMBER a decimal literal. A record
that lacks the field, or whose field is not a number, is not selected.

Which field is a record's policy and version:

| record | policy | version |
|---|---|---|
| Trajectory | ``policy`` | ``min_version`` (oldest weight version of its trained tokens) |
| TrainSample | ``trajectory.policy`` | ``trajectory.min_version`` |
| PromptStats, WeightChunk | ``policy`` | ``version`` |
| Metric | ``labels["policy"]`` | ``step`` (components report metrics at the weight version) |
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

from astraflow.core.errors import ConfigError
from astraflow.schemas.records import Metric, TrainSample, Trajectory

_NAME = r"[A-Za-z][A-Za-z0-9_]*"
WHERE = re.compile(
    rf"\s*({_NAME}(?:\.[A-Za-z0-9_-]+)*)\s*(>=|<=|==|!=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"
)
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
_MISSING = object()


@dataclass(frozen=True)
class Condition:
    """``path op number``, e.g. ``("reward",) > 0``."""

    path: tuple[str, ...]
    op: str
    number: float

    def __call__(self, record: Any) -> bool:
        value = field_value(record, self.path)
        if isinstance(value, bool) or not isinstance(value, Real):
            return False
        return OPERATORS[self.op](float(value), self.number)


def parse_where(text: str) -> Condition:
    """A ``Condition`` from ``FIELD OP NUMBER``; ``ConfigError`` says what is accepted otherwise."""
    match = WHERE.fullmatch(text)
    if match is None:
        raise ConfigError(
            f"--where {text!r}: expected FIELD OP NUMBER, e.g. 'reward>0' or 'reward_components.correct >= 1' "
            f"(OP one of {' '.join(OPERATORS)})"
        )
    path, op, number = match.groups()
    return Condition(tuple(path.split(".")), op, float(number))


def field_value(record: Any, path: Sequence[str]) -> Any:
    """The value at a dotted path of record attributes and map keys; ``None`` when it is absent."""
    value = record
    for name in path:
        if isinstance(value, Mapping):
            value = value.get(name, _MISSING)
        elif not name.startswith("_"):
            value = getattr(value, name, _MISSING)
        else:
            value = _MISSING
        if value is _MISSING:
            return None
    return value


def record_policy(record: Any) -> str | None:
    """The policy a record belongs to (see the table in the module docstring)."""
    if isinstance(record, TrainSample):
        return record.trajectory.policy
    if isinstance(record, Metric):
        return record.labels.get("policy")
    return getattr(record, "policy", None)


def record_version(record: Any) -> int | None:
    """The weight version of a record (see the table in the module docstring)."""
    if isinstance(record, Trajectory):
        return record.min_version
    if isinstance(record, TrainSample):
        return record.trajectory.min_version
    if isinstance(record, Metric):
        return record.step
    version = getattr(record, "version", None)
    return version if isinstance(version, int) else None


@dataclass(frozen=True)
class RecordFilter:
    """All given conditions at once; a filter with none selects every record."""

    policy: str | None = None
    min_version: int | None = None
    where: tuple[Condition, ...] = ()

    @classmethod
    def parse(cls, policy: str | None, min_version: int | None, where: Sequence[str]) -> RecordFilter:
        return cls(policy, min_version, tuple(parse_where(text) for text in where))

    @property
    def active(self) -> bool:
        return self.policy is not None or self.min_version is not None or bool(self.where)

    def __call__(self, record: Any) -> bool:
        if self.policy is not None and record_policy(record) != self.policy:
            return False
        if self.min_version is not None:
            version = record_version(record)
            if version is None or version < self.min_version:
                return False
        return all(condition(record) for condition in self.where)
