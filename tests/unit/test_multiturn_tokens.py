"""Token-exactness of multi-turn trajectories with a real tiny model, and the path to the trainer.

The policy is a tiny random Llama whose end-of-turn logit is raised by a fixed bias (a forward
hook, so the sampler and the trainer see the same model), so turns end early and episodes have
several policy and environment turns. Checked: the stored ids are the sampled ids; each turn was
sampled from exactly the stored prefix; a trainer forward pass over the stored ids reproduces
the behaviour log-probs of every trained token; masks and per-turn versions are right; the codec,
the stream operators and a trainer step accept loss masks with zeros inside the response.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import StreamConfig
from astraflow.engines.base import TurnSample
from astraflow.engines.torch_engine import TorchEngine
from astraflow.envs.base import EpisodeEnv, StepResult
from astraflow.episodes.loop import AgentLimits
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.multiturn import MultiTurnWorkflow
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import RolloutTask, Trajectory
from astraflow.schemas.validation import validate
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.pipeline import build_pipeline
from astraflow.tasks.search.facts import ALPHABET
from astraflow.training.loss import ppo_clip_loss
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer, collate, response_logprobs

PROVENANCE = Provenance("rollout-test", "eu", "cpu")
LIMITS = AgentLimits(max_turns=4, max_new_tokens=8, max_total_tokens=96, max_observation_tokens=16)


class Chatter(EpisodeEnv):
    """Never done: answers every turn with a short observation."""

    def reset(self) -> str:
        return "hello?\n"

    def step(self, action: str) -> StepResult:
        return StepResult(f"\nok {len(action)}\n")

    def reward(self) -> dict[str, float]:
        return {"reward": 1.0}


class RecordingEngine:
    """The real engine, recording every (version, context, sample); the version moves after each turn."""

    def __init__(self, inner: TorchEngine) -> None:
        self.inner = inner
        self.calls: list[tuple[int, np.ndarray, TurnSample]] = []

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    @property
    def version(self) -> int:
        return self.inner.version

    def generate_ids(
        self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False
    ) -> list[TurnSample]:
        samples = self.inner.generate_ids(contexts, max_new_tokens, temperature, greedy)
        self.calls += [(self.version, np.array(c), s) for c, s in zip(contexts, samples)]
        self.inner.version += 1  # as if a new weight version arrived between two turns
        return samples


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(
        tokenizer, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1)
    )
    bias = torch.zeros(len(tokenizer))
    bias[tokenizer.eos_token_id] = 4.0
    model.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)
    return model, tokenizer


@pytest.fixture(scope="module")
def rollout(model_and_tokenizer) -> tuple[list[Trajectory], RecordingEngine]:
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    engine = RecordingEngine(TorchEngine(model, tokenizer, version=10, seed=0))
    tasks = [RolloutTask(f"p{i}@0", f"p{i}", f"p{i}@0", "chat", "", "", 4, 0, 0) for i in range(3)]
    outcomes = MultiTurnWorkflow("main", lambda t, i: Chatter(), LIMITS, temperature=1.0).run_batch(
        {"main": engine}, tasks, PROVENANCE
    )
    assert all(o.error is None for o in outcomes)
    return [t for o in outcomes for t in o.trajectories], engine


def test_rollout_has_several_turns(rollout) -> None:
    trajectories, _ = rollout
    assert len(trajectories) == 12
    assert max(sum(t.role == "policy" for t in tr.turns) for tr in trajectories) >= 3


def test_stored_ids_are_the_sampled_ids_and_each_turn_saw_the_stored_prefix(rollout) -> None:
    trajectories, engine = rollout
    by_context: dict[bytes, list[tuple[int, TurnSample]]] = {}
    for version, context, sample in engine.calls:
        by_context.setdefault(context.tobytes(), []).append((version, sample))
    for trajectory in trajectories:
        for turn in (t for t in trajectory.turns if t.role == "policy"):
            prefix = np.concatenate([trajectory.prompt_ids, trajectory.response_ids[: turn.start]]).astype(np.int32)
            candidates = by_context[prefix.tobytes()]  # KeyError: the turn was sampled from another context
            stored_ids = trajectory.response_ids[turn.start : turn.end]
            stored_logprobs = trajectory.behaviour_logprobs[turn.start : turn.end]
            assert any(
                version == turn.version
                and np.array_equal(sample.ids[: len(stored_ids)], stored_ids)
                and np.array_equal(sample.logprobs[: len(stored_ids)], stored_logprobs)
                for version, sample in candidates
            )
            assert (trajectory.token_versions[turn.start : turn.end] == turn.version).all()


def test_masks_and_versions(rollout) -> None:
    trajectories, _ = rollout
    for trajectory in trajectories:
        assert validate(trajectory) is None
        covered = 0
        for turn in trajectory.turns:
            assert turn.start == covered
            covered = turn.end
            span = trajectory.loss_mask[turn.start : turn.end]
            assert (span == 1).all() if turn.role == "policy" else ((span == 0).all() and turn.role == "environment")
        assert covered == len(trajectory.response_ids)
        policy_versions = [t.version for t in trajectory.turns if t.role == "policy"]
        assert policy_versions == list(range(10, 10 + len(policy_versions)))  # one version per round
        assert trajectory.min_version == 10


def test_the_trainer_reproduces_the_behaviour_logprobs(rollout, model_and_tokenizer) -> None:
    trajectories, _ = rollout
    model, tokenizer = model_and_tokenizer
    examples = [
        PolicyExample(t.prompt_ids, t.response_ids, t.behaviour_logprobs, t.loss_mask, 0.0) for t in trajectories
    ]
    batch = collate(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = response_logprobs(model, batch)  # [B, R]
    trained = batch.loss_mask.bool()
    assert torch.allclose(logprobs[trained], batch.behaviour_logprobs[trained], atol=1e-4)


def test_generation_never_round_trips_through_text(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    odd = np.asarray(
        [tokenizer.convert_tokens_to_ids("h"), tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.eos_token_id],
        dtype=np.int32,
    )

    class Fixed:
        version = 0

        def __init__(self) -> None:
            self.tokenizer = tokenizer

        def generate_ids(self, contexts, max_new_tokens, temperature, greedy=False):
            return [TurnSample(odd.copy(), np.full(len(odd), -1.0, np.float32), True) for _ in contexts]

    class OneTurn(Chatter):
        def step(self, action: str) -> StepResult:
            return StepResult("", done=True)

    task = RolloutTask("x@0", "x", "x@0", "chat", "", "", 1, 0, 0)
    [outcome] = MultiTurnWorkflow("main", lambda t, i: OneTurn(), LIMITS, 1.0).run_batch(
        {"main": Fixed()}, [task], PROVENANCE
    )
    [trajectory] = outcome.trajectories
    assert np.array_equal(trajectory.response_ids, odd)
    retokenized = tokenizer(tokenizer.decode(odd, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
    assert retokenized != odd.tolist()  # what a decode → re-encode pipeline would have trained on


def test_codec_and_stream_operators_accept_multi_turn_trajectories(rollout) -> None:
    trajectories, _ = rollout
    codec = Codec()
    decoded = [codec.decode(codec.encode(t), expect=Trajectory) for t in trajectories[:4]]
    for before, after in zip(trajectories, decoded):
        assert np.array_equal(before.loss_mask, after.loss_mask) and before.turns == after.turns
    decoded[0].reward = 0.0  # a group with some signal
    group = Group(decoded[0].group_id, decoded)
    assert build_pipeline(StreamConfig(max_staleness=2)).process(group, trainer_version=11) is None
    assert group.advantages is not None and group.advantages[0] < 0 < group.advantages[1]


def test_tool_tokens_do_not_move_the_loss(rollout, model_and_tokenizer) -> None:
    trajectories, _ = rollout
    model, tokenizer = model_and_tokenizer
    examples = [
        PolicyExample(t.prompt_ids, t.response_ids, t.behaviour_logprobs, t.loss_mask, 1.0 - 2 * (i % 2))
        for i, t in enumerate(trajectories[:4])
    ]
    scrambled = [
        PolicyExample(
            e.prompt_ids,
            e.response_ids,
            np.where(e.loss_mask == 1, e.behaviour_logprobs, -30.0).astype(np.float32),
            e.loss_mask,
            e.advantage,
        )
        for e in examples
    ]

    def loss_and_grads(batch_examples):
        model.zero_grad(set_to_none=True)
        batch = collate(batch_examples, tokenizer.pad_token_id)
        loss, stats = ppo_clip_loss(
            response_logprobs(model, batch), batch.behaviour_logprobs, batch.advantages, batch.loss_mask
        )
        loss.backward()
        return float(loss.detach()), stats.tokens, [p.grad.clone() for p in model.parameters()]

    loss, tokens, grads = loss_and_grads(examples)
    loss2, tokens2, grads2 = loss_and_grads(scrambled)
    assert (
        tokens == tokens2 == sum(int(e.loss_mask.sum()) for e in examples) < sum(len(e.response_ids) for e in examples)
    )
    assert loss == pytest.approx(loss2, abs=1e-6) and all(
        torch.allclose(a, b, atol=1e-7) for a, b in zip(grads, grads2)
    )
    model.zero_grad(set_to_none=True)


def test_a_trainer_step_on_multi_turn_samples(rollout) -> None:
    trajectories, _ = rollout
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(
        tokenizer, TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1)
    )
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, PolicyStepConfig(lr_warmup_steps=0))
    examples = [
        PolicyExample(t.prompt_ids, t.response_ids, t.behaviour_logprobs, t.loss_mask, 1.0 - 2 * (i % 2))
        for i, t in enumerate(trajectories)
    ]
    stats = trainer.step(examples)
    assert (
        stats.version == 1
        and stats.tokens == sum(int(t.loss_mask.sum()) for t in trajectories)
        and np.isfinite(stats.loss)
    )
