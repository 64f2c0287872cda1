"""The native runtime's state outside memory, without a log: operator ``state_dict``s, partition
snapshots of half-filled groups, and the changelog's table and window of closed group ids.

Each state is checked the way a restart uses it: an operator (or buffer) rebuilt from the state
of another, halfway through a stream, must go on exactly as the one that never stopped.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from astraflow.log import Message
from astraflow.schemas.codec import Codec
from astraflow.streams.operators.advantage import ReinforcePPAdvantage, RewardNormaliser
from astraflow.streams.operators.base import Group, GroupBuffer, StatefulOperator
from astraflow.streams.operators.mixing import ReplayMixer
from astraflow.streams.runtimes.changelog import CLOSED_SLOTS, Changelog, pending_key
from astraflow.streams.runtimes.pending import restore, snapshot, snapshot_offsets
from tests.unit.test_stream_operators import traj

CODEC = Codec()


def stream(count: int) -> list[Group]:
    """``count`` groups of 2 with distinct rewards, each member at its own position of partition 0."""
    groups = []
    for g in range(count):
        members = [traj(f"g{g}", i, float((g * 7 + i * 3) % 5), size=2) for i in range(2)]
        groups.append(Group(f"g{g}", members, positions=[(0, 2 * g), (0, 2 * g + 1)]))
    return groups


def lookup_in(groups: list[Group]):
    """A ``TrajectoryLookup`` over the records of ``groups``."""
    records = {position: t for g in groups for position, t in zip(g.positions, g.trajectories)}
    return lambda positions: [records.get(position) for position in positions]


def fresh(group: Group) -> Group:
    """A copy of ``group`` as the runtime hands it to the operators: nothing computed yet."""
    return Group(group.group_id, list(group.trajectories), positions=list(group.positions))


def run_operator(operator: StatefulOperator, group: Group) -> list:
    """What ``operator`` makes of one group: advantages or rewards it writes, or the copies it mixes in."""
    if isinstance(operator, ReplayMixer):
        group.advantages = np.asarray(group.raw_rewards, dtype=np.float32)
        group.operators.append("grpo")
        return [
            (g.sample_id(t), a, g.operators) for g in operator.mix(group) for t, a in zip(g.trajectories, g.advantages)
        ]
    operator(group, 0)
    return (group.rewards if isinstance(operator, RewardNormaliser) else group.advantages).tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ReplayMixer(ratio=0.5, capacity=4, selector="uniform", seed=3),
        lambda: ReplayMixer(ratio=0.3, capacity=8, selector="latest"),
        lambda: RewardNormaliser(clip=2.0),
        lambda: ReinforcePPAdvantage(window=5),
    ],
    ids=["replay-uniform", "replay-latest", "reward-norm", "reinforce-pp"],
)
def test_an_operator_loaded_from_a_state_goes_on_as_the_one_that_saved_it(make) -> None:
    groups = stream(30)
    uninterrupted, saved = make(), make()
    for group in groups[:12]:
        run_operator(uninterrupted, fresh(group))
        run_operator(saved, fresh(group))
    restarted = make()
    restarted.load_state_dict(saved.state_dict(), lookup_in(groups))
    assert restarted.state_dict() == saved.state_dict()
    for group in groups[12:]:
        assert run_operator(restarted, fresh(group)) == run_operator(uninterrupted, fresh(group))


def test_a_replayed_group_whose_records_are_gone_is_left_out_of_the_restored_buffer() -> None:
    groups = stream(3)
    mixer = ReplayMixer(ratio=0.5, capacity=4)
    for group in groups:
        run_operator(mixer, fresh(group))
    restarted = ReplayMixer(ratio=0.5, capacity=4)
    restarted.load_state_dict(mixer.state_dict(), lookup_in(groups[1:]))
    assert [entry[0].group_id for entry in restarted._buffer] == ["g1", "g2"]


def test_a_buffer_restored_from_its_snapshot_completes_the_same_groups() -> None:
    members = [("a", 0, 100), ("b", 0, 200), ("c", 0, 300), ("a", 1, 400)]  # group, member, timestamp
    records = {
        offset: Message("t", 0, offset, g.encode(), CODEC.encode(traj(g, i, 1.0, size=3)), ts)
        for offset, (g, i, ts) in enumerate(members)
    }
    buffer = GroupBuffer()
    for offset, (g, i, ts) in enumerate(members):
        buffer.add(CODEC.decode(records[offset].value), 0, offset, ts)
    buffer.fail("c", "0@9", 3, 300)
    state = snapshot(buffer)
    assert sorted(snapshot_offsets(state)) == [0, 1, 2, 3]
    restored = GroupBuffer()
    assert restore(state, restored, 0, records, CODEC) == []
    assert restored.started == buffer.started and list(restored.started) == ["a", "b", "c"]
    assert restored.failed == buffer.failed
    assert {gid: sorted(m) for gid, m in restored.pending.items()} == {
        gid: sorted(m) for gid, m in buffer.pending.items()
    }
    last = traj("a", 2, 0.0, size=3)
    done, again = buffer.add(last, 0, 5, 500), restored.add(last, 0, 5, 500)
    assert done is not None and again is not None
    assert [t.trajectory_id for t in again.trajectories] == [t.trajectory_id for t in done.trajectories]
    assert again.positions == done.positions
    assert [g.group_id for g in restored.expire(150)] == [g.group_id for g in buffer.expire(150)] == ["b", "c"]


def test_a_member_whose_record_is_gone_makes_its_group_incomplete() -> None:
    buffer = GroupBuffer()
    buffer.add(traj("a", 0, 1.0, size=2), 0, 7, 100)
    restored = GroupBuffer()
    assert restore(snapshot(buffer), restored, 0, {}, CODEC) == []
    assert restored.failed == {"a": {"a/0": 0}} and "a" in restored.started


def test_the_changelog_writes_only_what_changed_and_forgets_an_aborted_transaction() -> None:
    changelog = Changelog("topic", {pending_key(0): b"[]"})
    changelog.put(pending_key(0), b"[]")
    changelog.put(pending_key(1), b"[1]")
    assert changelog.unsent == {pending_key(1): b"[1]"}
    changelog.discard()
    assert changelog.unsent == {} and pending_key(1) not in changelog.table
    changelog.put(pending_key(1), b"[1]")
    changelog.committed()
    assert changelog.table[pending_key(1)] == b"[1]" and changelog.unsent == {}


def test_the_window_of_closed_ids_keeps_the_last_slots_and_resumes_their_count() -> None:
    changelog = Changelog("topic", {})
    for n in range(CLOSED_SLOTS + 3):
        changelog.put_closed([(n % 2, f"g{n}", n == 5)])
        if n == 7:  # an aborted transaction takes no slot
            changelog.discard()
            continue
        changelog.committed()
    kept = [n for n in range(CLOSED_SLOTS + 3) if n != 7][-CLOSED_SLOTS:]
    expected = [gid for gid in (f"g{n}" for n in kept) if int(gid[1:]) % 2 == 1]
    assert [gid for gid, _ in changelog.closed(1)] == expected
    reloaded = Changelog("topic", dict(changelog.table))
    assert reloaded.closed(1) == changelog.closed(1)
    reloaded.put_closed([(0, "next", False)])
    (record,) = reloaded.unsent.values()
    assert json.loads(record)["n"] == CLOSED_SLOTS + 2  # counting on from the committed records
