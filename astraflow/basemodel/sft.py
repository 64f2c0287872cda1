"""Supervised warm-up: teach a fresh model the answer format until it is right some of the time.

RL from a random model never sees a reward; GRPO needs groups with mixed outcomes. So the base
checkpoint is a short supervised fine-tune (cross-entropy on the answer and eos tokens, prompt
masked) on the train split, stopped as soon as greedy held-out exact match reaches ``target_em``
(~0.30 in the product target), then saved with ``save_policy``. Near the target the score climbs
fast (0.195 → 0.38 in 25 steps of the math example, to 0.535 on another CPU), so an evaluation
more than ``max_overshoot`` past it is not where the warm-up stops: it goes back to the evaluation
before and replays the same batches, evaluating after each step, and stops at the first step that
reaches the target.

Multi-turn tasks are warmed up on demonstrations: the transcript of a perfect episode (the
task's ``demonstration`` turns, played in the real environment by ``envs.episodes.demonstrate``,
so tool calls, observations and tokens are exactly what a rollout would hold), with cross-entropy
on the policy turns only (loss mask 1) and the held-out success rate of greedy episodes as the
stopping score. ``fit`` is the loop both use.

Defaults are tuned on the 4x128 tiny model (benchmarks/prototype_grpo.py): lr 1e-3 reaches 0.30 in
~200 steps of 64, where lr 3e-3 needs ~1,400 and leaves a base that RL improves far more slowly.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.episodes.heldout import evaluate_exact_match
from astraflow.episodes.loop import Transcript
from astraflow.tasks.base import Problem
from astraflow.training.step import PolicyExample, collate, response_logprobs

logger = logging.getLogger(__name__)


@dataclass
class WarmupResult:
    """Where the warm-up stopped and its curve of (step, seconds, held-out EM)."""

    steps: int
    heldout_em: float
    seconds: float
    curve: list[tuple[int, float, float]] = field(default_factory=list)


def answer_examples(tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem]) -> list[PolicyExample]:
    """Supervision of single-turn rows: the answer and eos after the prompt."""
    prompts = tokenizer([problem.prompt for problem in problems])["input_ids"]
    answers = tokenizer([problem.answer for problem in problems], add_special_tokens=False)["input_ids"]
    examples = []
    for prompt, answer in zip(prompts, answers, strict=True):
        response = np.asarray([*answer, tokenizer.eos_token_id], dtype=np.int32)
        examples.append(
            PolicyExample(
                prompt_ids=np.asarray(prompt, dtype=np.int32),
                response_ids=response,
                behaviour_logprobs=np.zeros(len(response), dtype=np.float32),  # unused by the SFT loss
                loss_mask=np.ones(len(response), dtype=np.uint8),
                advantage=0.0,  # unused by the SFT loss
            )
        )
    return examples


def demonstration_examples(transcripts: Sequence[Transcript]) -> list[PolicyExample]:
    """Supervision of demonstrated episodes: every policy turn (environment turns masked out)."""
    examples = []
    for transcript in transcripts:
        response, _, _, mask = transcript.arrays()
        examples.append(
            PolicyExample(transcript.prompt_ids, response, np.zeros(len(response), dtype=np.float32), mask, 0.0)
        )
    return examples


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Problem],
    heldout: Sequence[Problem],
    *,
    target_em: float = 0.30,
    max_steps: int = 2000,
    batch_size: int = 64,
    lr: float = 1e-3,
    eval_every: int = 10,
    max_overshoot: float | None = 0.05,
    max_new_tokens: int = 4,
    micro_batch_tokens: int | None = None,
    seed: int = 0,
) -> WarmupResult:
    """Fine-tune ``model`` in place until greedy held-out EM ≥ ``target_em`` or ``max_steps`` steps
    (an evaluation past ``target_em + max_overshoot`` is replayed step by step: ``fit``)."""
    return fit(
        model,
        tokenizer.pad_token_id,
        answer_examples(tokenizer, train),
        lambda: evaluate_exact_match(model, tokenizer, heldout, max_new_tokens=max_new_tokens),
        target=target_em,
        max_steps=max_steps,
        batch_size=batch_size,
        lr=lr,
        eval_every=eval_every,
        max_overshoot=max_overshoot,
        micro_batch_tokens=micro_batch_tokens,
        seed=seed,
    )


def micro_batches(examples: Sequence[PolicyExample], max_tokens: int) -> list[list[PolicyExample]]:
    """``examples`` ordered by length and cut into runs of at most ``max_tokens`` rows x longest row
    (prompt and response together); a row longer than that is a micro-batch of its own. ``collate`` pads
    prompts and responses apart, so a run whose prompts differ in length pads a little beyond that."""
    parts: list[list[PolicyExample]] = []
    for example in sorted(examples, key=lambda e: e.length):
        if not parts or (len(parts[-1]) + 1) * example.length > max_tokens:
            parts.append([])
        parts[-1].append(example)
    return parts


def fit(
    model: PreTrainedModel,
    pad_id: int,
    examples: Sequence[PolicyExample],
    evaluate: Callable[[], float],
    *,
    target: float,
    max_steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    eval_every: int = 10,
    max_overshoot: float | None = 0.05,
    micro_batch_tokens: int | None = None,
    seed: int = 0,
) -> WarmupResult:
    """Cross-entropy on the masked response tokens of ``examples`` until ``evaluate()`` ≥ ``target``
    (checked every ``eval_every`` steps) or ``max_steps`` steps; the model ends in eval mode. With
    ``micro_batch_tokens`` each batch runs as ``micro_batches`` of it (the same gradient).

    An evaluation above ``target + max_overshoot`` crossed the target somewhere in the steps since the
    one before: the model, optimizer and batch order go back to that evaluation's state, and the same
    batches are replayed with an evaluation after every step, so the warm-up stops at the first step
    that reaches ``target`` (``replay_from``). ``max_overshoot=None`` stops at the first evaluation at
    or above it, wherever it lands."""
    started = time.perf_counter()
    order = random.Random(seed)
    examples = list(examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    em = evaluate()
    curve = [(0, time.perf_counter() - started, em)]
    step, every = 0, eval_every
    saved = _TrainingState.capture(model, optimizer, order, step, em)
    while em < target and step < max_steps:
        model.train()
        sampled = order.sample(examples, min(batch_size, len(examples)))
        tokens = float(sum(int(np.sum(example.loss_mask)) for example in sampled))
        optimizer.zero_grad(set_to_none=True)
        for part in micro_batches(sampled, micro_batch_tokens) if micro_batch_tokens else [sampled]:
            batch = collate(part, pad_id, model.device)
            logprobs = response_logprobs(model, batch)  # [B, R]
            # each part's share of the batch's mean: the summed gradients are the whole batch's
            (-(logprobs * batch.loss_mask).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % every == 0 or step == max_steps:
            em = evaluate()
            curve.append((step, time.perf_counter() - started, em))
            logger.info("warm-up step %d: held-out score %.3f (%.0f s)", step, em, curve[-1][1])
            if every > 1 and replay_from(em, target, max_overshoot):
                step, em = saved.restore(model, optimizer, order)
                every = 1
                logger.info("warm-up: past %.3f by more than %s, replaying from step %d", target, max_overshoot, step)
            elif every > 1:
                saved = _TrainingState.capture(model, optimizer, order, step, em)
    model.eval()
    return WarmupResult(steps=step, heldout_em=em, seconds=time.perf_counter() - started, curve=curve)


def replay_from(score: float, target: float, max_overshoot: float | None) -> bool:
    """Whether an evaluation that scored ``score`` went too far past ``target`` to stop at: more than
    ``max_overshoot`` above it (never with ``max_overshoot=None``)."""
    return max_overshoot is not None and score > target + max_overshoot


@dataclass
class _TrainingState:
    """What a warm-up step depends on, kept at an evaluation to replay the steps after it."""

    step: int
    score: float
    model: dict[str, torch.Tensor]
    optimizer: dict
    order: tuple

    @classmethod
    def capture(
        cls, model: PreTrainedModel, optimizer: torch.optim.Optimizer, order: random.Random, step: int, score: float
    ) -> "_TrainingState":
        weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        return cls(step, score, weights, copy.deepcopy(optimizer.state_dict()), order.getstate())

    def restore(
        self, model: PreTrainedModel, optimizer: torch.optim.Optimizer, order: random.Random
    ) -> tuple[int, float]:
        model.load_state_dict(self.model)
        optimizer.load_state_dict(self.optimizer)
        order.setstate(self.order)
        return self.step, self.score
