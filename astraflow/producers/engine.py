"""The torch inference engine: batched sampling with behaviour log-probs and swappable weights.

A rollout producer holds one engine per policy, asks it for ``n`` responses per prompt, and loads a
new weight version between two calls (never during one), so every token of one ``generate`` call
comes from ``engine.version``. Log-probs follow ``astraflow.models.sampling``: ``log_softmax(logits
/ T)`` of each sampled token, the distribution it was drawn from; the trainer scores tokens the same
way. Runs on CPU or GPU (wherever the model lives).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.models.sampling import sample


@dataclass
class Generation:
    """One sampled response to one prompt."""

    prompt_ids: np.ndarray  # [P] int32
    response_ids: np.ndarray  # [R] int32, the eos token included when finish_reason == "stop"
    logprobs: np.ndarray  # [R] float32, log_softmax(logits / T) of each response token
    text: str  # the response decoded without special tokens
    finish_reason: str  # "stop" (sampled eos) or "length" (hit max_new_tokens)


class TorchEngine:
    """Samples from a transformers causal LM; ``version`` is the weight version it currently holds."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int = 0, seed: int | None = None
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.version = version
        self._generator = torch.Generator(device=model.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()

    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        max_new_tokens: int,
        temperature: float,
        greedy: bool = False,
    ) -> list[list[Generation]]:
        """``n`` responses for each prompt, in prompt order; ``greedy`` takes the argmax (T ignored)."""
        prompt_ids = [np.asarray(ids, dtype=np.int32) for ids in self.tokenizer(list(prompts))["input_ids"]]
        batch = sample(
            self.model,
            prompt_ids,
            n=n,
            max_new_tokens=max_new_tokens,
            eos_id=self.tokenizer.eos_token_id,
            pad_id=self.tokenizer.pad_token_id,
            temperature=temperature,
            greedy=greedy,
            generator=self._generator,
        )
        responses = [batch.tokens[row, : batch.lengths[row]] for row in range(len(batch.lengths))]
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [
            [
                Generation(
                    prompt_ids=prompt_ids[index],
                    response_ids=responses[row],
                    logprobs=batch.logprobs[row, : batch.lengths[row]],
                    text=texts[row],
                    finish_reason="stop" if batch.stopped[row] else "length",
                )
                for row in range(index * n, (index + 1) * n)
            ]
            for index in range(len(prompt_ids))
        ]

    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap in the weights of ``version`` (a full state dict); call between two ``generate`` calls."""
        self.model.load_state_dict(state)
        self.version = version
