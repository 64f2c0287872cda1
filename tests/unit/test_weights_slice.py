"""A training run followed through sparse deltas reaches exactly the accuracy of one followed through full versions.

The tiny model takes real AdamW steps (the supervised step of the warm-up: collate, response
log-probs, masked cross-entropy); every version goes through the real publish path twice, as
deltas (inline, with retention) and as full versions (through the store), each to its own topic
with its own follower. At every version both followers must hold exactly the trainer's bf16 bits,
and the held-out accuracy and loss of models loaded from either must be equal.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from astraflow.basemodel.sft import answer_examples
from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import WeightsConfig
from astraflow.episodes.heldout import evaluate_exact_match
from astraflow.log import open_log
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.tasks.arithmetic import addition_problems
from astraflow.training.step import collate, response_logprobs
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import to_transfer
from astraflow.weights.publish import WeightPublisher
from tests.unit.test_weight_delta import assert_bit_exact

SPEC = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=0)
STEPS = 30
EVAL_EVERY = 10


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch) -> None:
    model.train()
    logprobs = response_logprobs(model, batch)  # [B, R]
    loss = -(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def held_out(state: dict, tokenizer, heldout, batch) -> tuple[float, float]:
    """(exact-match accuracy, mean answer log-prob) of a fresh model loaded with ``state``."""
    model = build_tiny_model(tokenizer, SPEC)
    model.load_state_dict(state)
    accuracy = evaluate_exact_match(model, tokenizer, heldout)
    with torch.no_grad():
        logprob = float((response_logprobs(model, batch) * batch.loss_mask).sum() / batch.loss_mask.sum())
    return accuracy, logprob


def test_deltas_reach_the_accuracy_of_full_versions_bit_for_bit(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SPEC)
    train, heldout = addition_problems(seed=0, heldout_size=200)
    examples = answer_examples(tokenizer, train)
    heldout_batch = collate(answer_examples(tokenizer, heldout), tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.0)
    order = random.Random(0)
    configs = {
        "delta": WeightsConfig(full_sync_interval=10, keep_versions=3),
        "full": WeightsConfig(encoding="full", transport="store", store=str(tmp_path / "store")),
    }
    topics = RunTopics("slice", "math", tuple(configs))
    scores: dict[str, list[tuple[float, float]]] = {"delta": [], "full": [], "trainer": []}
    with open_log("embedded", path=tmp_path / "log.sqlite") as log, log.producer() as producer:
        topics.ensure(log, partitions=1)
        publishers = {
            name: WeightPublisher(producer, Codec(), topics.weights(name), name, config, log=log)
            for name, config in configs.items()
        }
        followers = {
            name: WeightFollower(log, topics.weights(name), payload=True, poll_timeout=0.05).start() for name in configs
        }
        encodings = []
        try:
            for version in range(STEPS + 1):
                if version:
                    sft_step(model, optimizer, collate(order.sample(examples, 32), tokenizer.pad_token_id))
                expected = to_transfer(model.state_dict(), "bf16")
                encodings.append(publishers["delta"].publish(model.state_dict(), version).encoding)
                publishers["full"].publish(model.state_dict(), version)
                for name, follower in followers.items():
                    assert follower.wait_for(version, timeout=60), name
                    taken, state = follower.take()
                    assert taken == version
                    assert_bit_exact(state, expected)
                    if version % EVAL_EVERY == 0:
                        scores[name].append(held_out(state, tokenizer, heldout, heldout_batch))
                if version % EVAL_EVERY == 0:
                    scores["trainer"].append(held_out(expected, tokenizer, heldout, heldout_batch))
        finally:
            for follower in followers.values():
                follower.close()
    assert encodings.count("delta") == STEPS - STEPS // 10  # a full version every 10
    assert all(f.skipped_deltas == f.corrupt_versions == 0 for f in followers.values())
    assert scores["delta"] == scores["full"] == scores["trainer"]
    assert scores["delta"][-1][1] > scores["delta"][0][1]  # it learned: the held-out answers grew likelier
