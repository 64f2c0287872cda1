"""GiGPO's step-level advantages: a hand-computed group of multi-turn episodes, the pipeline that
runs them, the samples and replay state that carry them, the loss that uses them, and the real
trainer reading them from the samples topic."""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.config import parse_config
from astraflow.consumers.trainer.component import Trainer
from astraflow.core.errors import ConfigError
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import TrainSample, Trajectory, Turn
from astraflow.streams.operators.advantage import (
    GigpoStepAdvantage,
    GrpoAdvantage,
    anchor_states,
    gigpo_token_advantages,
)
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.mixing import ReplayMixer
from astraflow.streams.runtimes.native import NativeStreamProcessor
from astraflow.training.loss import ppo_clip_loss
from astraflow.training.step import PolicyExample, collate
from tests.unit.test_stream_operators import read_all, traj
from tests.unit.test_stream_state import lookup_in
from tests.unit.test_trainer_reference import GROUP, recorded_samples
from tests.unit.tiny_trainer import stopping_at, tiny_math_config

PROMPT = np.array([5, 6, 7], dtype=np.int32)
ROOM_X, ROOM_Y, ROOM_Z = [40, 41], [50, 51], [60, 61]  # what the environment says: two tokens each


def episode(group: str, index: int, spans: list[list[int]], reward: float) -> Trajectory:
    """A multi-turn episode: ``spans`` alternate policy turns and observations, policy first."""
    response, turns = [], []
    for k, span in enumerate(spans):
        turns.append(Turn("policy" if k % 2 == 0 else "environment", len(response), len(response) + len(span), 0))
        response += span
    mask = [1 if turn.role == "policy" else 0 for turn in turns for _ in range(turn.end - turn.start)]
    return replace(
        traj(group, index, reward, size=3, n=len(response)),
        workflow="rooms",
        prompt_ids=PROMPT,
        response_ids=np.asarray(response, dtype=np.int32),
        loss_mask=np.asarray(mask, dtype=np.uint8),
        turns=turns,
    )


def three_games(group: str = "g") -> list[Trajectory]:
    """Two won games and a lost one; the first two both reach room X, where they part."""
    return [
        episode(group, 0, [[1, 2], ROOM_X, [3, 4]], 1.0),  # X, then a move that wins
        episode(group, 1, [[1, 2], ROOM_X, [8, 9], ROOM_Y, [3, 4]], 0.0),  # X, then a move that loses
        episode(group, 2, [[2, 1], ROOM_Z, [3, 4]], 1.0),  # Z (seen once), then a win
    ]


def test_anchor_states_are_the_observations_each_policy_turn_answers() -> None:
    lost = three_games()[1]
    states = [state for _, state in anchor_states(lost)]
    assert states == [PROMPT.tobytes(), np.asarray(ROOM_X, np.int32).tobytes(), np.asarray(ROOM_Y, np.int32).tobytes()]


def test_step_advantages_by_hand() -> None:
    games = three_games()
    episode_advantages = np.array([0.5, -1.0, 0.5], dtype=np.float32)  # any episode-level advantages
    gamma, weight = 0.9, 2.0
    tokens = gigpo_token_advantages(games, np.array([1.0, 0.0, 1.0]), episode_advantages, weight, gamma)
    # First moves all answer the prompt: returns 0.9 (won in 2 turns), 0 (lost), 0.9 (won in 2);
    # mean 0.6, sample std 0.9 / sqrt(3): step advantages 1/sqrt(3), -2/sqrt(3), 1/sqrt(3).
    first = [1 / math.sqrt(3), -2 / math.sqrt(3), 1 / math.sqrt(3)]
    # In room X: returns 1 (the winning move, the game's last turn) and 0.9 * 0 (the losing move):
    # mean 0.5, sample std 1 / sqrt(2): +-1/sqrt(2). Rooms Y and Z were answered once: no step advantage.
    x = [1 / math.sqrt(2), -1 / math.sqrt(2)]
    expected = [
        [0.5 + weight * first[0]] * 2 + [0.5] * 2 + [0.5 + weight * x[0]] * 2,
        [-1.0 + weight * first[1]] * 2 + [-1.0] * 2 + [-1.0 + weight * x[1]] * 2 + [-1.0] * 2 + [-1.0] * 2,
        [0.5 + weight * first[2]] * 2 + [0.5] * 2 + [0.5] * 2,
    ]
    assert [t.dtype for t in tokens] == [np.float32] * 3
    for got, want in zip(tokens, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_an_operator_needs_the_episode_advantages_first_and_the_config_says_so() -> None:
    group = Group("g", three_games())
    with pytest.raises(ValueError, match="after an advantage operator|episode advantages"):
        GigpoStepAdvantage()(group, 0)
    GrpoAdvantage()(group, 0)
    GigpoStepAdvantage()(group, 0)
    assert [len(t) for t in group.token_advantages] == [len(g.response_ids) for g in group.trajectories]
    with pytest.raises(ConfigError, match="gigpo must come after grpo"):
        parse_config({"stream": {"pipeline": [{"op": "gigpo"}, {"op": "grpo"}]}})


@pytest.fixture
def ctx(tmp_path: Path):
    pipeline = [{"op": "grpo"}, {"op": "gigpo", "gamma": 0.9}, {"op": "replay", "ratio": 0.5}]
    context = ComponentContext(parse_config({"stream": {"max_staleness": 1, "pipeline": pipeline}}), tmp_path, "stream")
    yield context
    context.close()


def test_samples_and_their_replays_carry_the_token_advantages(ctx: ComponentContext) -> None:
    processor = NativeStreamProcessor(ctx, "main")
    processor.transactions.begin()
    groups = [Group(name, three_games(name)) for name in ("a", "b")]
    accepted = [g for g in groups if processor._process(g, 0)]
    processor._emit(accepted, 0)
    processor.transactions.commit()
    ctx.producer.flush()
    samples = {s.sample_id: s for s in read_all(ctx, ctx.topics.samples("main"), TrainSample)}
    assert sorted(samples) == ["a/0", "a/0#replay1", "a/1", "a/1#replay1", "a/2", "a/2#replay1", "b/0", "b/1", "b/2"]
    grpo = GrpoAdvantage()
    expected = Group("a", three_games("a"))
    grpo(expected, 0)
    want = gigpo_token_advantages(expected.trajectories, expected.rewards, expected.advantages, 1.0, 0.9)
    for index in range(3):
        np.testing.assert_array_equal(samples[f"a/{index}"].token_advantages, want[index])
        np.testing.assert_array_equal(samples[f"a/{index}#replay1"].token_advantages, want[index])
        assert samples[f"a/{index}"].advantage == pytest.approx(float(expected.advantages[index]))


def test_a_replay_buffer_restored_from_its_state_keeps_the_token_advantages() -> None:
    group = Group("g", three_games(), positions=[(0, 0), (0, 1), (0, 2)])
    GrpoAdvantage()(group, 0)
    GigpoStepAdvantage()(group, 0)
    mixer = ReplayMixer(ratio=0.5, capacity=2)
    mixer.mix(group)
    restarted = ReplayMixer(ratio=0.5, capacity=2)
    restarted.load_state_dict(mixer.state_dict(), lookup_in([group]))
    restored = restarted._buffer[0][0]
    for got, want in zip(restored.token_advantages, group.token_advantages, strict=True):
        np.testing.assert_array_equal(got, want)
    legacy = Group("g", three_games(), positions=[(0, 0), (0, 1), (0, 2)], advantages=group.advantages)
    older = ReplayMixer(ratio=0.5, capacity=2)
    older.mix(legacy)  # a state saved before token advantages existed has none, and restores as such
    again = ReplayMixer(ratio=0.5, capacity=2)
    again.load_state_dict(older.state_dict(), lookup_in([group]))
    assert again._buffer[0][0].token_advantages is None


def test_the_loss_weighs_each_token_by_its_own_advantage() -> None:
    games = three_games()
    per_token = [np.arange(len(g.response_ids), dtype=np.float32) - 2.0 for g in games]
    examples = [
        PolicyExample(g.prompt_ids, g.response_ids, g.behaviour_logprobs, g.loss_mask, a)
        for g, a in zip(games, per_token)
    ]
    scalar = replace(examples[0], advantage=0.25)  # one advantage for the whole response, beside per-token ones
    batch = collate([scalar, *examples[1:]], pad_id=0)
    assert batch.advantages.shape == batch.loss_mask.shape  # [B, R]
    assert batch.advantages[0, :6].tolist() == [0.25] * 6 and batch.advantages[0, 6:].tolist() == [0.0] * 4
    assert batch.advantages[1].tolist() == per_token[1].tolist()
    assert batch.advantages[2, 6:].tolist() == [0.0] * 4  # padding
    # the gradient of the loss in each token's log-prob is -w * A / tokens, token by token (rho = 1, w = 1)
    logprobs = batch.behaviour_logprobs.clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(logprobs, batch.behaviour_logprobs, batch.advantages, batch.loss_mask)
    loss.backward()
    tokens = batch.loss_mask.sum()
    torch.testing.assert_close(logprobs.grad, -batch.advantages * batch.loss_mask / tokens)
    # all-scalar batches keep their [B] advantages
    assert collate([scalar], pad_id=0).advantages.shape == (1,)


def first_loss(tmp_path: Path, samples: list[TrainSample]) -> float:
    """The loss of the real trainer's first version on ``samples`` (Avro on the embedded log)."""
    config = tiny_math_config(tmp_path, {"train": {"batch_samples": len(samples)}})
    ctx = ComponentContext(config, tmp_path / "run", "train")
    try:
        for sample in samples:
            ctx.producer.send(
                ctx.topics.samples("main"), ctx.codec.encode(sample), key=sample.trajectory.group_id.encode()
            )
        ctx.producer.flush()
        stop = threading.Event()
        stopping_at(Trainer(ctx, "main"), 1, stop).run(stop)
        metrics = [record for _, record in decode_snapshot(ctx.log, ctx.topics.metrics(ctx.role))]
    finally:
        ctx.close()
    [loss] = [m.value for m in metrics if m.name == "train.loss"]
    return loss


def test_the_trainer_trains_on_a_samples_token_advantages(tmp_path: Path) -> None:
    samples = recorded_samples(2 * GROUP)
    broadcast = [
        replace(s, token_advantages=np.full(len(s.trajectory.response_ids), s.advantage, dtype=np.float32))
        for s in samples
    ]
    first_token = []  # the first token's advantage doubled: another loss
    for s in broadcast:
        tokens = s.token_advantages.copy()
        tokens[0] *= 2.0
        first_token.append(replace(s, token_advantages=tokens))
    plain = first_loss(tmp_path / "plain", samples)
    assert first_loss(tmp_path / "broadcast", broadcast) == plain  # the same advantages, token by token
    assert first_loss(tmp_path / "first", first_token) != pytest.approx(plain, abs=1e-6)
