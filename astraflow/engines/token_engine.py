"""Token-in, token-out generation: what multi-turn workflows need from an engine.

``TorchEngine.generate`` takes prompt *strings*; a multi-turn episode must instead continue its
exact token ids (prompt + earlier turns), or a decode → re-encode round trip could change the
tokens the policy conditioned on (TRL #5224). ``TokenEngine`` is that contract; an engine that has
``generate_ids`` itself (a future vLLM engine: ``prompt_token_ids``) is used as it is, and a
``TorchEngine`` is wrapped by ``TorchTokenEngine``, which samples with the engine's live model
(so weights it loads between batches apply) through ``astraflow.models.sampling.sample``: same
log-prob convention, same left-padding and position ids as the trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass
class TurnSample:
    """One policy turn as the sampler produced it."""

    ids: np.ndarray  # [T] int32, the eos token included when ``stopped``
    logprobs: np.ndarray  # [T] float32, log_softmax(logits / T) of each sampled token
    stopped: bool  # True when the turn ended with eos (the end-of-turn token)


@runtime_checkable
class TokenEngine(Protocol):
    tokenizer: object
    version: int

    def generate_ids(self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False) -> list[TurnSample]:
        """One continuation of each context, in order."""


class TorchTokenEngine:
    """``TokenEngine`` over a ``TorchEngine``; ``seed`` fixes its own sampling generator."""

    def __init__(self, engine, seed: int | None = None) -> None:
        import torch

        self.engine = engine
        self._generator = torch.Generator(device=engine.model.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def version(self) -> int:
        return self.engine.version

    def generate_ids(self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False) -> list[TurnSample]:
        from astraflow.models.sampling import sample

        tokenizer = self.engine.tokenizer
        batch = sample(
            self.engine.model,
            contexts,
            max_new_tokens=max_new_tokens,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            temperature=temperature,
            greedy=greedy,
            generator=self._generator,
        )
        return [
            TurnSample(batch.tokens[row, : batch.lengths[row]].copy(), batch.logprobs[row, : batch.lengths[row]].copy(), bool(batch.stopped[row]))
            for row in range(len(contexts))
        ]


def as_token_engine(engine, seed: int | None = None) -> TokenEngine:
    """``engine`` itself when it generates from token ids, else a ``TorchTokenEngine`` over it."""
    return engine if isinstance(engine, TokenEngine) else TorchTokenEngine(engine, seed)
