"""``astraflow tail`` filters: the ``--where`` parser, policy / version rules, and tail selecting records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astraflow.analysis.record_filter import Condition, RecordFilter, parse_where
from astraflow.analysis.tail import tail_topic
from astraflow.core.errors import ConfigError
from astraflow.schemas.records import Metric, PromptStats, TrainSample
from tests.unit.recorded_run import RUN, record_run, trajectory


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("reward>0", Condition(("reward",), ">", 0.0)),
        (" reward >= 0.5 ", Condition(("reward",), ">=", 0.5)),
        ("reward_components.correct==1", Condition(("reward_components", "correct"), "==", 1.0)),
        ("trajectory.reward<-1e-3", Condition(("trajectory", "reward"), "<", -0.001)),
        ("min_version != 2", Condition(("min_version",), "!=", 2.0)),
        ("value <= .5", Condition(("value",), "<=", 0.5)),
    ],
)
def test_where_parses(text: str, parsed: Condition) -> None:
    assert parse_where(text) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "reward",
        "reward > x",
        "reward >> 1",
        "__class__ > 0",
        "reward > 1; import os",
        "len(reward) > 0",
        "reward > 0 and x < 1",
        "",
    ],
)
def test_where_rejects_anything_else(text: str) -> None:
    with pytest.raises(ConfigError, match="FIELD OP NUMBER"):
        parse_where(text)


T = trajectory("main", "g", 0, 3, 1.0, 0)
S = TrainSample("s", trajectory("solver", "g", 1, 5, 0.0, 0), -0.5, 6)
M = Metric("stream", "stream.staleness", 2.0, 7, 0, {"policy": "main"})
P = PromptStats("p", "g", "math", "main", 4, 8, 0.5, 0.5, 0.5)


@pytest.mark.parametrize(
    ("policy", "min_version", "where", "selected"),
    [
        (None, None, [], [T, S, M, P]),
        ("main", None, [], [T, M, P]),
        ("solver", None, [], [S]),
        (None, 5, [], [S, M]),
        (None, None, ["reward>0"], [T]),
        (None, None, ["trajectory.reward<=0", "advantage<0"], [S]),
        (None, None, ["reward_components.correct >= 1"], [T]),
        (None, None, ["value==2"], [M]),
        (None, None, ["policy>0"], []),
        ("main", 4, ["mean_reward>0.4"], [P]),
    ],
)
def test_record_filter(policy: str | None, min_version: int | None, where: list[str], selected: list) -> None:
    keep = RecordFilter.parse(policy, min_version, where)
    assert [r for r in (T, S, M, P) if keep(r)] == selected


def test_tail_prints_only_selected_records(tmp_path: Path) -> None:
    run = record_run(tmp_path / RUN)
    keep = RecordFilter.parse("main", 1, ["reward>0"])
    with run.log() as log:
        lines = [
            json.loads(line)
            for line in tail_topic(log, f"{RUN}.trajectories.main", from_beginning=True, limit=5, select=keep)
        ]
    expected = {t.trajectory_id for t in run.trajectories["main"] if t.min_version >= 1 and t.reward > 0}
    assert len(expected) == 5
    assert {line["value"]["trajectory_id"] for line in lines} == expected
