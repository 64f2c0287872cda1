"""The engine contract: what a rollout producer asks of whatever generates its tokens.

An engine samples responses to prompts (``generate``, strings in) or continues exact token
contexts (``generate_ids``, what multi-turn workflows need) and reports, for every sampled token,
its behaviour log-prob under the convention of ``astraflow.engines.sampling``: ``log_softmax(logits
/ T)``, the distribution the token was drawn from (greedy: the T = 1 log-prob of the argmax).
``version`` is the weight version every token of one call comes from; ``load_state_dict`` swaps in
a new one between calls. An engine that cannot change its weights (a remote server without an
update endpoint) says so with ``refreshable = False`` and keeps reporting the version it serves.

Implementations only write ``sample``: ``n`` continuations of each context, row ``i * n + j``
being sample ``j`` of context ``i``. Prompts are encoded here, once, the same way for every
engine (the tokenizer's chat template when ``chat_template`` is on and the tokenizer has one).

``TokenEngine`` is the part of the contract multi-turn episodes use: a turn must continue its exact
token ids (prompt + earlier turns), or a decode → re-encode round trip could change the tokens the
policy conditioned on (TRL #5224). Every ``Engine`` is one; test doubles may implement only it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from astraflow.core.errors import AstraFlowError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


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

    def generate_ids(
        self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False
    ) -> list[TurnSample]:
        """One continuation of each context, in order."""


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], chat_template: bool) -> list[np.ndarray]:
    """Token ids of each prompt as every engine encodes it: as one user turn of the chat template
    (``chat_template``, where the tokenizer has one), or the raw text. The stream processor encodes a
    task's prompt the same way to check the prompt a trajectory claims."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        ids = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            for prompt in prompts
        ]
    else:
        ids = tokenizer(list(prompts))["input_ids"]
    return [np.asarray(row, dtype=np.int32) for row in ids]


class EngineError(AstraFlowError):
    """An engine cannot serve what the producer needs (e.g. a server that returns no log-probs)."""


@dataclass
class Generation:
    """One sampled response to one prompt."""

    prompt_ids: np.ndarray  # [P] int32
    response_ids: np.ndarray  # [R] int32, the eos token included when finish_reason == "stop"
    logprobs: np.ndarray  # [R] float32, log_softmax(logits / T) of each response token
    text: str  # the response decoded without special tokens
    finish_reason: str  # "stop" (sampled eos) or "length" (hit max_new_tokens)


class Engine(ABC):
    """Samples from one policy; ``version`` is the weight version it currently serves."""

    refreshable: bool = True
    """False: ``load_state_dict`` cannot change what the engine serves (it keeps its version)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, version: int = 0, chat_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.version = version
        self.chat_template = chat_template and bool(getattr(tokenizer, "chat_template", None))

    def encode(self, prompts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each prompt: as one user turn of the chat template, or the raw text."""
        return encode_prompts(self.tokenizer, prompts, self.chat_template)

    def generate(
        self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, greedy: bool = False
    ) -> list[list[Generation]]:
        """``n`` responses for each prompt, in prompt order; ``greedy`` takes the argmax (T ignored)."""
        prompt_ids = self.encode(prompts)
        rows = self.sample(prompt_ids, n, max_new_tokens, temperature, greedy)
        texts = self.tokenizer.batch_decode([row.ids for row in rows], skip_special_tokens=True)
        return [
            [
                Generation(
                    prompt_ids[index],
                    rows[row].ids,
                    rows[row].logprobs,
                    texts[row],
                    "stop" if rows[row].stopped else "length",
                )
                for row in range(index * n, (index + 1) * n)
            ]
            for index in range(len(prompt_ids))
        ]

    def generate_ids(
        self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False
    ) -> list[TurnSample]:
        """One continuation of each token context, in order."""
        return self.sample(contexts, 1, max_new_tokens, temperature, greedy)

    @abstractmethod
    def sample(
        self, contexts: Sequence[np.ndarray], n: int, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[TurnSample]:
        """``n`` continuations per context; row ``i * n + j`` is sample ``j`` of context ``i``."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Serve the weights of ``version`` (a full state dict) from the next call on."""
