"""``engine.type: simulated``: an inference replica that takes the time of a generation without a model.

For capacity planning (docs/simulated_cluster.md): rollout producers, the log, stream processors
and trainers run for real, while each engine call sleeps what it would take on one GPU
replica and returns token ids and log-probs of the right shapes. Two time models make it:

- ``ResponseLengths``: response lengths are lognormal with a given median and tail
  (``p99_over_p50``; reasoning models are long-tailed, ~8), cut at ``max_new_tokens``.
- ``DecodeTimeModel``: a continuous-batching server with ``max_concurrency`` slots. A call's
  sequences take slots in order as slots free up; each decode step advances every running
  sequence by one token and costs ``decode_step_seconds + running · seq_step_seconds`` (reading
  the weights once, plus each sequence's KV cache). So a call lasts at least as long as its
  longest response: the straggler that stalls a synchronous iteration. Prefill is not modelled.

Rewards must vary as in a real run, or dynamic sampling would drop every group: a response to
an arithmetic prompt (``12+35=``, or a judge's ``12+35=47?``) starts with the right sum with
probability ``accuracy`` and with a near miss otherwise, then a newline and filler up to its
length. Other prompts get filler only, which no reward accepts.

Time passes through ``sleep(simulated_seconds)``: ``time.sleep`` scaled by ``time_scale`` by
default (sleeping keeps the CPU free, so many simulated GPUs run on a laptop); tests pass their own.
"""

from __future__ import annotations

import heapq
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from astraflow.engines.base import Engine, TurnSample

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from astraflow.config import SimulatedEngineOptions

Z99 = 2.3263478740408408
"""The standard normal's 99th percentile: a lognormal's p99 / median is exp(σ · Z99)."""
NEAR_MISSES = (-10, -2, -1, 1, 2, 10)
ARITHMETIC = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*(\d+)?\s*\??\s*$")


@dataclass(frozen=True)
class ResponseLengths:
    """Lognormal response lengths in tokens: ``median`` and ``p99_over_p50`` fix μ and σ."""

    median: float
    p99_over_p50: float

    @property
    def sigma(self) -> float:
        return math.log(self.p99_over_p50) / Z99

    def quantile(self, q: float) -> float:
        """The length below which a fraction ``q`` of responses fall (before the cut)."""
        from statistics import NormalDist

        return self.median * math.exp(self.sigma * NormalDist().inv_cdf(q))

    def sample(self, rng: np.random.Generator, count: int, cap: int, floor: int = 1) -> np.ndarray:
        """``count`` lengths, rounded and clipped to [``floor``, ``cap``]: [count] int64."""
        raw = np.exp(math.log(self.median) + self.sigma * rng.standard_normal(count))
        return np.clip(np.rint(raw), floor, max(cap, floor)).astype(np.int64)


@dataclass(frozen=True)
class DecodeTimeModel:
    """Seconds a continuous-batching replica takes to decode a call's sequences."""

    step_seconds: float
    seq_step_seconds: float
    max_concurrency: int

    def seconds(self, lengths: Sequence[int]) -> float:
        """Makespan of sequences of these lengths (tokens), admitted in order into the free slots."""
        finishes: list[int] = []
        events: list[tuple[int, int]] = []
        for length in lengths:
            start = heapq.heappop(finishes) if len(finishes) >= self.max_concurrency else 0
            heapq.heappush(finishes, start + int(length))
            events += [(start, 1), (start + int(length), -1)]
        events.sort()
        total, running, previous = 0.0, 0, 0
        for step, change in events:
            if running:
                total += (step - previous) * (self.step_seconds + running * self.seq_step_seconds)
            running, previous = running + change, step
        return total


def arithmetic_answer(prompt: str, right: bool, rng: np.random.Generator) -> str:
    """The first line a simulated policy writes: the sum of ``a+b=`` (or of a judge's ``a+b=c?``),
    right or a near miss; ``""`` for a prompt that is not a sum."""
    match = ARITHMETIC.match(prompt)
    if not match:
        return ""
    total = int(match.group(1)) + int(match.group(2))
    return str(total if right else max(0, total + int(rng.choice(NEAR_MISSES))))


class SimulatedEngine(Engine):
    """Sleeps each call's modelled decode time; ``simulated_seconds`` adds up calls and weight loads."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        options: SimulatedEngineOptions,
        seed: int | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(tokenizer)
        self.options = options
        self.lengths = ResponseLengths(options.median_tokens, options.p99_over_p50)
        self.decode = DecodeTimeModel(options.decode_step_seconds, options.seq_step_seconds, options.max_concurrency)
        self.rng = np.random.default_rng(seed)
        self.sleep = sleep or (lambda seconds: time.sleep(seconds * options.time_scale))
        self.simulated_seconds = 0.0
        self.newline = self._ids("\n")
        self.filler = self._ids("0123456789 ")

    def _ids(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    def _response(self, answer: str, max_new_tokens: int) -> TurnSample:
        """``answer``, a newline, filler and eos: a sampled length of tokens, cut at ``max_new_tokens``
        (no eos then)."""
        body = np.concatenate([self._ids(answer), self.newline]) if answer else np.zeros(0, dtype=np.int64)
        length = int(self.lengths.sample(self.rng, 1, max_new_tokens, floor=min(len(body) + 1, max_new_tokens))[0])
        stopped = length < max_new_tokens
        filler = self.rng.choice(self.filler, size=max(length - stopped - len(body), 0))
        ids = np.concatenate([body, filler, [self.tokenizer.eos_token_id] if stopped else []])[:max_new_tokens].astype(
            np.int32
        )
        logprobs = -np.abs(self.rng.standard_normal(len(ids))).astype(np.float32)
        return TurnSample(ids, logprobs, stopped)

    def sample(
        self, contexts: Sequence[np.ndarray], n: int, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[TurnSample]:
        prompts = self.tokenizer.batch_decode([np.asarray(c) for c in contexts], skip_special_tokens=True)
        accuracy = self.options.accuracy
        rows = [
            self._response(arithmetic_answer(prompt, bool(self.rng.random() < accuracy), self.rng), max_new_tokens)
            for prompt in prompts
            for _ in range(n)
        ]
        self._wait(self.decode.seconds([len(row.ids) for row in rows]))
        return rows

    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Take ``load_seconds`` to "apply" ``version`` (the weights themselves are not used)."""
        self._wait(self.options.load_seconds)
        self.version = version

    def _wait(self, seconds: float) -> None:
        self.sleep(seconds)
        self.simulated_seconds += seconds
