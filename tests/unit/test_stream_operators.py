"""Stream operators against hand-computed tables, the pipeline stages, and the native runtime's records."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from pydantic import TypeAdapter

from astraflow.config import StreamConfig, parse_config
from astraflow.config.pipeline import OperatorSpec
from astraflow.log import TopicPartition
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import Metric, TrainSample, Trajectory
from astraflow.schemas.validation import Limits, validate
from astraflow.streams.operators.advantage import (
    DrGrpoAdvantage,
    GrpoAdvantage,
    ReinforcePPAdvantage,
    RewardNormaliser,
    RlooAdvantage,
)
from astraflow.streams.operators.base import OPERATORS, Group, GroupBuffer
from astraflow.streams.operators.filters import (
    DuplicateFilter,
    ResponseLengthFilter,
    RewardRangeFilter,
    StalenessFilter,
    ZeroVarianceFilter,
)
from astraflow.streams.operators.mixing import OfflineMixer, ReplayMixer
from astraflow.streams.operators.ordering import EdfOrdering, FifoOrdering
from astraflow.streams.operators.pipeline import build_pipeline
from astraflow.streams.runtimes.native import NativeStreamProcessor


def traj(group: str, index: int, reward: float, version: int = 0, size: int = 4, n: int = 3) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group}/{index}",
        episode_id=f"{group}/{index}",
        group_id=group,
        task_id=group,
        prompt_id="p",
        policy="main",
        workflow="math",
        prompt_ids=np.arange(3, dtype=np.int32),
        response_ids=np.arange(n, dtype=np.int32),
        behaviour_logprobs=np.full(n, -0.5, dtype=np.float32),
        token_versions=np.full(n, version, dtype=np.int32),
        loss_mask=np.ones(n, dtype=np.uint8),
        reward=reward,
        group_size=size,
    )


@pytest.mark.parametrize(
    ("trainer_version", "token_version", "max_staleness", "dropped"),
    [(5, 5, 0, False), (5, 4, 0, True), (5, 3, 2, False), (5, 2, 2, True), (0, 0, 0, False)],
)
def test_staleness_filter(trainer_version: int, token_version: int, max_staleness: int, dropped: bool) -> None:
    group = Group("g", [traj("g", 0, 1.0, token_version)])
    reason = StalenessFilter(max_staleness)(group, trainer_version)
    assert (reason is not None) is dropped
    if dropped:
        assert reason.startswith("stale")


def test_min_version_ignores_masked_tokens() -> None:
    t = traj("g", 0, 1.0, version=7)
    t.token_versions = np.array([3, 7, 7], dtype=np.int32)
    t.loss_mask = np.array([0, 1, 1], dtype=np.uint8)
    assert t.min_version == 7


@pytest.mark.parametrize(
    ("rewards", "reason_prefix", "advantages"),
    [
        ([1, 0, 0, 0], None, [1.5, -0.5, -0.5, -0.5]),
        ([1, 1, 1, 1], "zero_variance", None),
        ([0, 0, 0, 0], "zero_variance", None),
    ],
)
def test_pipeline_grpo_then_zero_variance(rewards, reason_prefix, advantages) -> None:
    group = Group("g", [traj("g", i, r) for i, r in enumerate(rewards)])
    reason = build_pipeline(StreamConfig(max_staleness=1)).process(group, trainer_version=0)
    if reason_prefix is None:
        assert reason is None
        np.testing.assert_allclose(group.advantages, advantages, atol=1e-5)
        assert group.operators == ["staleness", "grpo", "zero_variance"]
    else:
        assert reason.startswith(reason_prefix)


def test_zero_variance_kept_when_disabled() -> None:
    group = Group("g", [traj("g", i, 1.0) for i in range(4)])
    assert build_pipeline(StreamConfig(drop_zero_variance=False)).process(group, 0) is None


def test_group_buffer_completes_groups_and_drops_duplicates() -> None:
    buffer = GroupBuffer()
    assert buffer.add(traj("a", 0, 1.0, size=2), partition=0, offset=10) is None
    assert buffer.add(traj("a", 0, 1.0, size=2), partition=0, offset=11) is None  # duplicate id
    assert buffer.add(traj("b", 0, 1.0, size=2), partition=1, offset=5) is None
    group = buffer.add(traj("a", 1, 0.0, size=2), partition=0, offset=12)
    assert group is not None and [t.trajectory_id for t in group.trajectories] == ["a/0", "a/1"]
    assert buffer.duplicates == 1
    assert buffer.add(traj("a", 1, 0.0, size=2), partition=0, offset=13) is None  # late duplicate of a done group
    assert buffer.duplicates == 2
    assert buffer.closed is None  # kept only for a runtime that journals them


def test_group_buffer_keeps_closed_ids_for_a_new_buffer_to_drop_late_copies() -> None:
    buffer = GroupBuffer(keep_closed=True)
    buffer.add(traj("a", 0, 1.0, size=2), partition=0, offset=0, timestamp=0)
    buffer.add(traj("b", 0, 1.0, size=2), partition=0, offset=1, timestamp=0)
    buffer.add(traj("a", 1, 0.0, size=2), partition=0, offset=2, timestamp=0)
    buffer.add(traj("c", 0, 1.0, size=2), partition=0, offset=3, timestamp=10_000)
    assert [group.group_id for group in buffer.expire(timeout_ms=5_000)] == ["b"]
    assert buffer.closed == [("a", False), ("b", True)]
    restarted = GroupBuffer()
    for gid, expired in buffer.closed:
        restarted.mark_closed(gid, expired)
    assert restarted.add(traj("a", 1, 0.0, size=2), partition=0, offset=4) is None and restarted.duplicates == 1
    assert "b" in restarted.expired_ids and "a" not in restarted.expired_ids


LIMITS = Limits(max_abs_reward=1e6, group_size=4, vocab_size=10, context_length=8)
"""traj() fits these: rewards of 0/1, groups of 4, ids 0..2, 3 + 3 tokens."""


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("reward", float("nan"), "reward: non-finite nan"),
        ("reward", float("inf"), "reward: non-finite inf"),
        ("reward", 1e200, "reward: 1e+200 is beyond stream.max_abs_reward (1e+06)"),
        ("reward", -1e39, "reward: -1e+39 is beyond stream.max_abs_reward"),
        ("loss_mask", np.ones(2, dtype=np.uint8), "loss_mask: 2 entries for 3 response tokens"),
        ("loss_mask", np.array([1, 3, 1], dtype=np.uint8), "loss_mask: values must be 0 or 1, found 3"),
        ("behaviour_logprobs", np.array([0.0, np.nan, 0.0], dtype=np.float32), "behaviour_logprobs: non-finite"),
        ("response_ids", np.array([1, 10, 2], dtype=np.int32), "response_ids: token id 10 is not below the vocab"),
        ("prompt_ids", np.array([-1, 2], dtype=np.int32), "prompt_ids: negative token id -1"),
        ("prompt_ids", np.arange(6, dtype=np.int32), "prompt_ids + response_ids: 9 tokens exceed the model's context"),
        ("group_size", 0, "group_size: 0 (an empty group)"),
        ("group_size", 5, "group_size: 5, but the policy's rollout.group_size is 4"),
        ("token_versions", np.array([0, 7, 0], dtype=np.int32), "token_versions: version 7 is above the newest"),
    ],
)
def test_validate_names_the_field_at_fault(field: str, value, problem: str) -> None:
    t = traj("g", 0, 1.0)
    setattr(t, field, value)
    assert validate(t, LIMITS, newest_version=6).startswith(problem)
    assert validate(traj("g", 0, 1.0), LIMITS, newest_version=6) is None


def group(name: str, rewards: list[float], version: int = 0, lengths: list[int] | None = None) -> Group:
    lengths = lengths or [3] * len(rewards)
    size = len(rewards)
    return Group(name, [traj(name, i, r, version, size, n) for i, (r, n) in enumerate(zip(rewards, lengths))])


R3 = math.sqrt(3)


@pytest.mark.parametrize(
    ("operator", "rewards", "expected"),
    [
        (GrpoAdvantage(), [1, 0, 0, 0], [1.5, -0.5, -0.5, -0.5]),  # mean 1/4, sample std 1/2
        (GrpoAdvantage(), [2, 0], [1 / math.sqrt(2), -1 / math.sqrt(2)]),  # mean 1, std sqrt(2)
        (GrpoAdvantage(), [7], [0]),
        (DrGrpoAdvantage(), [1, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]),  # no std division
        (DrGrpoAdvantage(), [1, 1, 0, 0], [0.5, 0.5, -0.5, -0.5]),
        (DrGrpoAdvantage(), [2, 0], [1, -1]),
        (RlooAdvantage(), [1, 0, 0, 0], [1, -1 / 3, -1 / 3, -1 / 3]),  # 1 - mean(0,0,0); 0 - mean(1,0,0)
        (RlooAdvantage(), [1, 1, 0, 0], [2 / 3, 2 / 3, -2 / 3, -2 / 3]),
        (RlooAdvantage(), [2, 0], [2, -2]),
        (RlooAdvantage(), [5], [0]),
    ],
)
def test_group_advantages(operator, rewards: list[float], expected: list[float]) -> None:
    g = group("g", rewards)
    assert operator(g, 0) is None
    assert g.advantages.dtype == np.float32
    np.testing.assert_allclose(g.advantages, expected, atol=1e-5)


def test_reinforce_pp_whitens_over_a_window_of_recent_responses() -> None:
    operator = ReinforcePPAdvantage(window=8)
    table = [
        # group rewards -> centred within the group, then whitened by the window's mean and population std
        ([1, 0, 0, 0], [R3, -1 / R3, -1 / R3, -1 / R3]),  # window: [.75 -.25 -.25 -.25]: mean 0, var 3/16
        ([1, 1, 0, 0], [1.0690450, 1.0690450, -1.0690450, -1.0690450]),  # 8 responses: var 7/32
        ([1, 1, 1, 0], [0.5345225, 0.5345225, 0.5345225, -1.6035675]),  # first group left: var 7/32
    ]
    for index, (rewards, expected) in enumerate(table):
        g = group(f"g{index}", rewards)
        operator(g, 0)
        np.testing.assert_allclose(g.advantages, expected, atol=1e-5)


@pytest.mark.parametrize(
    ("clip", "groups", "expected_last"),
    [
        (None, [[1, 0, 0, 0]], [R3, -1 / R3, -1 / R3, -1 / R3]),  # mean 1/4, population std sqrt(3)/4
        (1.0, [[1, 0, 0, 0]], [1.0, -1 / R3, -1 / R3, -1 / R3]),
        (None, [[1, 0, 0, 0], [1, 1, 1, 1]], [0.7745967] * 4),  # 8 rewards: mean 5/8, var 15/64
    ],
)
def test_reward_norm_uses_running_statistics(clip, groups, expected_last) -> None:
    operator = RewardNormaliser(clip=clip)
    for index, rewards in enumerate(groups):
        g = group(f"g{index}", rewards)
        operator(g, 0)
    np.testing.assert_allclose(g.rewards, expected_last, atol=1e-5)  # eps = 1e-6 in the denominator
    np.testing.assert_allclose(g.raw_rewards, groups[-1])
    assert operator.count == 4 * len(groups)


def test_reward_norm_feeds_the_advantage_but_not_the_feedback() -> None:
    pipeline = build_pipeline(parse_config({"stream": {"pipeline": [{"op": "reward_norm"}, {"op": "dr_grpo"}]}}).stream)
    g = group("g", [1, 0, 0, 0])
    assert pipeline.process(g, 0) is None
    np.testing.assert_allclose(
        g.advantages, [0.75 / (R3 / 4), -0.25 / (R3 / 4), -0.25 / (R3 / 4), -0.25 / (R3 / 4)], atol=1e-5
    )
    assert g.operators == ["reward_norm", "dr_grpo"]


@pytest.mark.parametrize(
    ("operator", "rewards", "lengths", "reason"),
    [
        (ZeroVarianceFilter(), [1, 1], None, "zero_variance"),
        (ZeroVarianceFilter(), [1, 0], None, None),
        (ResponseLengthFilter(min_tokens=2, max_tokens=4), [1, 0], [2, 4], None),
        (ResponseLengthFilter(min_tokens=2, max_tokens=4), [1, 0], [1, 4], "response_length: 1 tokens < min 2"),
        (ResponseLengthFilter(min_tokens=2, max_tokens=4), [1, 0], [3, 5], "response_length: 5 tokens > max 4"),
        (ResponseLengthFilter(max_tokens=None), [1, 0], [1, 900], None),
        (RewardRangeFilter(low=0.2, high=0.8), [1, 0], None, None),  # mean 0.5
        (RewardRangeFilter(low=0.2, high=0.8), [1, 1, 1, 0], None, None),  # mean 0.75
        (RewardRangeFilter(low=0.2, high=0.8), [1, 0, 0, 0, 0, 0], None, "reward_range: mean reward 0.166667 outside"),
        (RewardRangeFilter(low=0.2, high=0.8), [1, 1, 1, 1], None, "reward_range: mean reward 1 outside [0.2, 0.8]"),
        (RewardRangeFilter(low=0.0, on="each"), [1, -0.5], None, "reward_range: each reward -0.5 outside [0, inf]"),
        (RewardRangeFilter(high=1.0, on="each"), [1, 0.5], None, None),
    ],
)
def test_filters(operator, rewards, lengths, reason) -> None:
    result = operator(group("g", rewards, lengths=lengths), 0)
    if reason is None:
        assert result is None
    else:
        assert result is not None and result.startswith(reason)


def test_duplicate_filter_remembers_a_bounded_number_of_ids() -> None:
    operator = DuplicateFilter(remember=2)
    assert operator(group("a", [1]), 0) is None
    assert operator(group("a", [1]), 0).startswith("duplicate: trajectory a/0")
    assert operator(group("b", [1, 0]), 0) is None  # remembers b/0, b/1; a/0 is forgotten
    assert operator(group("a", [1]), 0) is None
    assert operator(group("b", [1, 0]), 0) is not None


def test_edf_orders_by_deadline_and_fifo_by_arrival() -> None:
    ready = [group(name, [1, 0], version) for name, version in [("a", 5), ("b", 3), ("c", 4), ("d", 3)]]
    assert [g.group_id for g in EdfOrdering().order(ready)] == ["b", "d", "c", "a"]  # ties keep arrival order
    assert [g.group_id for g in FifoOrdering().order(ready)] == ["a", "b", "c", "d"]


def replayed_shares(mixer: ReplayMixer, groups: int, group_size: int, batch: int) -> tuple[list[float], list[Group]]:
    stream: list[Group] = []
    for index in range(groups):
        fresh = group(f"g{index}", [1.0] + [0.0] * (group_size - 1))
        fresh.advantages = np.full(group_size, float(index), dtype=np.float32)
        stream += [fresh, *mixer.mix(fresh)]
    samples = [g.replay > 0 for g in stream for _ in g.trajectories]
    shares = [float(np.mean(samples[i : i + batch])) for i in range(0, len(samples) - batch + 1, batch)]
    return shares, stream


@pytest.mark.parametrize("selector", ["latest", "uniform"])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.75])
def test_replay_ratio_holds_in_every_batch(selector: str, ratio: float) -> None:
    mixer = ReplayMixer(ratio=ratio, capacity=16, selector=selector, seed=7)
    shares, stream = replayed_shares(mixer, groups=2000, group_size=8, batch=256)
    assert len(shares) > 50
    assert all(abs(share - ratio) <= 8 / 256 + 1e-9 for share in shares[1:])  # within one group of ⌊ρ·B⌋
    assert abs(np.mean(shares) - ratio) < 0.01
    fresh_seen: list[int] = []
    ids: set[str] = set()
    for g in stream:
        index = int(g.group_id[1:])
        if g.replay:
            assert index in fresh_seen[-17:-1]  # from the bounded buffer of the groups accepted before
            np.testing.assert_array_equal(g.advantages, index)  # keeps the advantages it was accepted with
            if selector == "latest" and ratio <= 0.5:
                assert index == fresh_seen[-2]  # the group accepted before the one just emitted
        else:
            fresh_seen.append(index)
        for t in g.trajectories:
            assert g.sample_id(t) not in ids
            ids.add(g.sample_id(t))


def test_uniform_replay_is_seeded() -> None:
    runs = [
        [g.group_id for g in replayed_shares(ReplayMixer(0.5, 8, "uniform", seed), 200, 4, 64)[1]] for seed in (1, 1, 2)
    ]
    assert runs[0] == runs[1] != runs[2]


def test_pipeline_emits_replays_in_edf_order_with_provenance() -> None:
    stream = parse_config(
        {
            "stream": {
                "max_staleness": 3,
                "pipeline": [
                    {"op": "staleness"},
                    {"op": "grpo"},
                    {"op": "zero_variance"},
                    {"op": "replay", "ratio": 0.5, "capacity": 4},
                    {"op": "edf"},
                ],
            }
        }
    ).stream
    pipeline = build_pipeline(stream)
    assert pipeline.max_staleness == 3 and stream.replay_ratio == 0.5
    first, second = group("a", [1, 0], version=5), group("b", [0, 1], version=4)
    assert pipeline.process(first, 5) is None and pipeline.process(second, 5) is None
    emitted = pipeline.emit([first, second])
    assert [(g.group_id, g.replay) for g in emitted] == [("b", 0), ("a", 0), ("a", 1)]  # b's share is a replay of a
    assert all(g.operators == ["staleness", "grpo", "zero_variance", "replay", "edf"] for g in emitted)


@pytest.mark.parametrize("weight", [0.2, 0.5])
def test_offline_share_holds_in_every_batch(weight: float) -> None:
    """Fed enough, the offline mixer's groups make up ``weight`` of every batch, to within one group."""
    mixer, size, batch = OfflineMixer("old.trajectories.main", weight=weight), 4, 64
    emitted: list[Group] = []
    for index in range(200):
        fresh = group(f"f{index}", [1, 0, 1, 0])
        while mixer.demand(size) > 0:
            mixer.feed(replace(group(f"o{len(emitted)}-{mixer.demand(size)}", [0, 1, 0, 1]), origin="#offline0"))
        emitted += [fresh, *mixer.mix(fresh)]
    samples = [g.reused for g in emitted for _ in range(size)]
    shares = [sum(samples[i : i + batch]) / batch for i in range(0, len(samples) - batch + 1, batch)]
    assert all(abs(share - weight) <= size / batch + 1e-9 for share in shares), shares
    offline = next(g for g in emitted if g.reused)
    assert offline.sample_id(offline.trajectories[0]).endswith("#offline0")


def test_offline_mixer_owes_nothing_for_groups_that_found_it_empty() -> None:
    mixer = OfflineMixer("old.trajectories.main", weight=0.5)
    for index in range(10):
        assert mixer.mix(group(f"f{index}", [1, 0])) == []  # the topic had nothing: no debt builds up
    mixer.feed(replace(group("o", [0, 1]), origin="#offline0"))
    assert mixer.demand(2) <= 0
    assert [g.group_id for g in mixer.mix(group("f", [1, 0]))] == ["o"]


def test_every_operator_spec_builds_its_registered_class() -> None:
    adapter = TypeAdapter(OperatorSpec)
    names = {spec.model_fields["op"].default for spec in get_args(get_args(OperatorSpec)[0])}
    assert names == set(OPERATORS)
    defaults = {
        "reward_range": {"low": 0.0},
        "offline": {"topic": "old.trajectories.main"},
        "reward_terms": {"weights": {"x": 1.0}},
    }
    for name in sorted(names):
        spec = adapter.validate_python({"op": name, **defaults.get(name, {})})
        params = spec.model_dump(exclude={"op"})
        if name == "staleness":
            params["max_staleness"] = 1
        assert OPERATORS[name](**params).name == name


@pytest.fixture
def ctx(tmp_path: Path):
    pipeline = [
        {"op": "staleness"},
        {"op": "rloo"},
        {"op": "zero_variance"},
        {"op": "replay", "ratio": 0.5},
        {"op": "fifo"},
    ]
    context = ComponentContext(parse_config({"stream": {"max_staleness": 1, "pipeline": pipeline}}), tmp_path, "stream")
    yield context
    context.close()


def read_all(ctx: ComponentContext, topic: str, record: type) -> list:
    consumer = ctx.log.consumer(group_id=None)
    consumer.assign([TopicPartition(topic, p) for p in range(ctx.log.describe_topic(topic).partitions)])
    consumer.seek_to_beginning()
    records = [ctx.codec.decode(m.value, expect=record) for m in consumer.poll(max_records=10_000, timeout=0.0)]
    consumer.close()
    return records


def test_native_runtime_records_provenance_replays_and_drops_by_reason(ctx: ComponentContext) -> None:
    processor = NativeStreamProcessor(ctx, "main")
    processor.transactions.begin()
    groups = [group("a", [1, 0], 5), group("b", [1, 1], 5), group("c", [0, 1], 2), group("d", [0, 1], 5)]
    accepted = [g for g in groups if processor._process(g, 5)]
    processor._emit(accepted, 5)
    processor._redelivered = 3
    processor._count_redeliveries(5)
    processor.transactions.commit()
    ctx.producer.flush()
    samples = read_all(ctx, ctx.topics.samples("main"), TrainSample)
    assert sorted((s.sample_id, s.replayed) for s in samples) == [
        ("a/0", False),
        ("a/0#replay1", True),
        ("a/1", False),
        ("a/1#replay1", True),
        ("d/0", False),
        ("d/1", False),
    ]
    assert {tuple(s.operators) for s in samples} == {("staleness", "rloo", "zero_variance", "replay", "fifo")}
    assert {s.sample_id: s.advantage for s in samples}["a/0"] == pytest.approx(1.0)  # RLOO of [1, 0]: 1 - 0
    assert all(s.deadline_version == 6 for s in samples)
    assert processor.drops == {"zero_variance": 1, "stale": 1, "redelivered": 3}
    metrics = {m.name: m.value for m in read_all(ctx, ctx.topics.metrics(ctx.role), Metric)}
    assert metrics["stream.dropped.zero_variance"] == 1 and metrics["stream.dropped.stale"] == 1
    assert metrics["stream.dropped.redelivered"] == 3 and metrics["stream.replayed_groups"] == 1


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.3, 0.5, 0.75, 0.9])
@pytest.mark.parametrize(("batch", "group_size"), [(512, 8), (256, 8), (64, 4), (100, 6), (32, 16)])
def test_the_feeders_average_fresh_groups_fill_every_batch_and_no_more(
    batch: int, group_size: int, ratio: float
) -> None:
    """Where a batch may take what the one before left over (not lockstep with replay), the feeder
    releases the average count of fresh groups a batch needs, each batch's once the trainer published
    the previous version; with what the replay mixer adds they must reach every batch, the first
    included, or the run waits for ever, and the surplus must not grow, or the trainer's backlog
    does and it trains ever staler samples. Lockstep with replay has a count of its own
    (``PolicyBudget.lockstep_replays``), checked by ``test_lockstep_replay.py``."""
    from astraflow.producers.feeder.component import PolicyBudget

    batch_groups = -(-batch // group_size)  # the trainer cuts batches at whole groups
    budget = PolicyBudget(0, batch_groups, 1, ratio)
    mixer = ReplayMixer(ratio=ratio, capacity=64) if ratio else None
    emitted = released = 0
    surplus = []
    for version in range(200):
        for index in range(released, budget.capacity(version, dropped_groups=0)):
            g = group(f"g{index}", [1.0] + [0.0] * (group_size - 1))
            emitted += len(g.trajectories) + (sum(len(extra.trajectories) for extra in mixer.mix(g)) if mixer else 0)
            released += 1
        surplus.append(emitted - (version + 1) * batch_groups * group_size)
        assert surplus[-1] >= 0, (version, released, emitted)  # batch version + 1 is complete
    # what is left over stays within a couple of groups: it does not grow with the versions
    assert max(surplus[100:]) <= 2 * group_size * (1 + ratio / (1 - ratio)), surplus[-5:]
    assert max(surplus[100:]) - min(surplus[100:]) <= 2 * group_size * (1 + ratio / (1 - ratio))
