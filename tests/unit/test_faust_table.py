"""The faust runtime's table of half-filled groups, and which stream runtime a config picks.

The table is checked without faust or a broker: a dict stands for faust's store, a list for the
changelog and a dict of offsets for the input partition. Each record's effect on a
``GroupBuffer`` becomes at most one new entry; a group that completes deletes its entries; the
changelog hears of the net change at each flush (a commit); and
a buffer rebuilt from the entries and the records they point at (what a restarted worker does)
completes the same groups as the buffer it replaces.
"""

from __future__ import annotations

import pytest

from astraflow.config import parse_config
from astraflow.core.errors import ConfigError
from astraflow.log import Message
from astraflow.schemas.codec import Codec
from astraflow.streams.operators.base import GroupBuffer
from astraflow.streams.runtimes.faust_table import PendingTable, entry_key
from astraflow.streams.runtimes.processing import Arrival
from tests.unit.test_stream_operators import traj

CODEC = Codec()


INPUT: dict[int, Message] = {}
"""The input partition: record offset → record."""


@pytest.fixture(autouse=True)
def empty_input() -> None:
    INPUT.clear()


def arrive(table: PendingTable, buffer: GroupBuffer, arrival: Arrival, value: bytes = b"") -> object:
    """Append one record to the input, and do what the faust runtime does with it: join, then journal."""
    offset = len(INPUT)
    INPUT[offset] = Message("trajectories", 0, offset, None, value, 0)
    before = table.entries(buffer, 0, arrival.group_id)
    group = arrival.join(buffer, INPUT[offset])
    table.journal(before, table.entries(buffer, 0, arrival.group_id), 0, offset, arrival.group_size)
    return group


def member(group: str, index: int, size: int = 3) -> tuple[Arrival, bytes]:
    trajectory = traj(group, index, float(index), size=size)
    return Arrival(group, trajectory.trajectory_id, size, trajectory), CODEC.encode(trajectory)


def test_entries_are_written_at_a_flush_and_deleted_with_their_group() -> None:
    data, changelog = {}, []
    table, buffer = PendingTable(data, lambda key, value, partition: changelog.append((key, value))), GroupBuffer()
    for index in (0, 1):
        assert arrive(table, buffer, *member("a", index, size=4)) is None
    assert arrive(table, buffer, *member("a", 1, size=4)) is None  # redelivered: no change
    assert arrive(table, buffer, Arrival("a", "0@7", 0), b"garbage") is None  # dead-lettered member
    assert sorted(data) == sorted(
        [entry_key(0, b"m", "a", "a/0"), entry_key(0, b"m", "a", "a/1"), entry_key(0, b"f", "a", "0@7")]
    )
    assert data[entry_key(0, b"m", "a", "a/1")] == b"1" and data[entry_key(0, b"f", "a", "0@7")] == b"0"  # offset; size
    assert changelog == []  # kept for the commit
    assert table.flush() == 3 and sorted(changelog) == sorted((key, value) for key, value in data.items())
    assert arrive(table, buffer, *member("b", 0)) is None
    group = arrive(table, buffer, *member("a", 2, size=4))  # the 4th member: 2 trajectories, 1 failed, this one
    assert (
        group is not None
        and group.failed == ["0@7"]
        and [t.trajectory_id for t in group.trajectories] == ["a/0", "a/1", "a/2"]
    )
    assert list(data) == [entry_key(0, b"m", "b", "b/0")]
    del changelog[:]
    assert table.flush() == 4
    assert sorted(changelog) == sorted(
        [
            (entry_key(0, b"m", "a", "a/0"), None),
            (entry_key(0, b"m", "a", "a/1"), None),
            (entry_key(0, b"f", "a", "0@7"), None),
            (entry_key(0, b"m", "b", "b/0"), b"4"),
        ]
    )
    assert table.flush() == 0  # nothing changed since


def test_an_operators_state_is_written_when_it_changed_and_kept_apart_from_the_groups() -> None:
    data, changelog = {}, []
    table, buffer = (
        PendingTable(data, lambda key, value, partition: changelog.append((key, value, partition))),
        GroupBuffer(),
    )
    assert arrive(table, buffer, *member("a", 0)) is None
    table.put_state(1, 2, "reward_norm", b"\x00stats")
    assert table.flush() == 2
    assert (entry_key(1, b"o", "2", "reward_norm"), b"\x00stats", 1) in changelog
    table.put_state(1, 2, "reward_norm", b"\x00stats")  # unchanged: not written again
    assert table.flush() == 0
    table.put_state(1, 2, "reward_norm", b"\x00newer")
    assert table.flush() == 1 and changelog[-1] == (entry_key(1, b"o", "2", "reward_norm"), b"\x00newer", 1)
    assert (
        table.operator_state(1, 2, "reward_norm") == b"\x00newer" and table.operator_state(0, 2, "reward_norm") is None
    )
    table.put_state(0, 2, "reward_norm", b"\x00partition 0")  # the same partition as the half-filled group
    assert table.members(0) == {("m", "a", "a/0"): 0} and table.offsets(0) == [0]


def test_a_group_completed_between_two_flushes_never_reaches_the_changelog() -> None:
    data, changelog = {}, []
    table, buffer = PendingTable(data, lambda key, value, partition: changelog.append((key, value))), GroupBuffer()
    for index in range(3):
        group = arrive(table, buffer, *member("a", index))
    assert group is not None and data == {}
    assert table.flush() == 0 and changelog == []


def test_restored_entries_are_deleted_from_the_changelog_when_their_group_completes() -> None:
    data, changelog = {}, []
    table = PendingTable(data, lambda key, value, partition: changelog.append((key, value)))
    arrive(table, GroupBuffer(), *member("a", 0))
    table.flush()  # a/0 is in the changelog; a restarted worker's table starts from it
    restarted = PendingTable(dict(data), lambda key, value, partition: changelog.append((key, value)))
    buffer = restarted.restore(0, {offset: INPUT[offset] for offset in restarted.offsets(0)}, CODEC)
    del changelog[:]
    for index in (1, 2):
        group = arrive(restarted, buffer, *member("a", index))
    assert group is not None and restarted.flush() == 1
    assert changelog == [(entry_key(0, b"m", "a", "a/0"), None)]


def test_a_restored_buffer_completes_the_same_groups() -> None:
    data: dict[bytes, bytes] = {}
    table, buffer = PendingTable(data, lambda *write: None), GroupBuffer()
    arrive(table, buffer, *member("a", 0))
    arrive(table, buffer, *member("b", 0, size=2))
    arrive(table, buffer, Arrival("b", "b/1", 2), b"")  # b's second member was dead-lettered: b completes, and goes
    data[entry_key(1, b"m", "c", "c/0")] = b"0"  # another partition's entry
    restored = table.restore(0, {offset: INPUT[offset] for offset in table.offsets(0)}, CODEC)
    assert set(restored.pending) == {"a"} and restored.failed == {}
    for index in (1, 2):
        group = arrive(table, restored, *member("a", index))
    assert group is not None and [t.trajectory_id for t in group.trajectories] == ["a/0", "a/1", "a/2"]
    assert list(data) == [entry_key(1, b"m", "c", "c/0")]


@pytest.mark.parametrize(
    ("log", "runtime", "expected"),
    [
        ({}, None, "native"),
        ({"backend": "kafka", "bootstrap": "h:9092"}, None, "faust"),
        ({"backend": "kafka", "bootstrap": "h:9092"}, "native", "native"),
        ({}, "native", "native"),
    ],
)
def test_the_stream_runtime_defaults_to_faust_on_kafka(log: dict, runtime: str | None, expected: str) -> None:
    stream = {"runtime": runtime} if runtime else {}
    assert parse_config({"log": log, "stream": stream}).stream_runtime() == expected


def test_faust_on_the_embedded_log_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="stream.runtime: 'faust' runs on Kafka only"):
        parse_config({"stream": {"runtime": "faust"}})


def test_a_member_whose_record_is_gone_makes_its_group_incomplete() -> None:
    table, buffer = PendingTable({}, lambda *write: None), GroupBuffer()
    for index in (0, 1):
        arrive(table, buffer, *member("a", index))
    restored = table.restore(0, {1: INPUT[1]}, CODEC)  # offset 0 deleted by retention
    group = arrive(table, restored, *member("a", 2))
    assert (
        group is not None
        and group.failed == ["a/0"]
        and [t.trajectory_id for t in group.trajectories] == ["a/1", "a/2"]
    )
