"""The torch inference engine: batched sampling with behaviour log-probs and swappable weights.

A rollout producer holds one engine per policy, asks it for ``n`` responses per prompt, and loads a
new weight version between two calls (never during one), so every token of one ``generate`` call
comes from ``engine.version``. Log-probs follow ``astraflow.engines.sampling``: ``log_softmax(logits
/ T)`` of each sampled token, the distribution it was drawn from; the trainer scores tokens the same
way. Runs on CPU or GPU (wherever the model lives). For token contexts (``generate_ids``, the
turns of multi-turn episodes) it holds the keys and values of the rows its last such call ended
with (``astraflow.engines.sampling.PrefixCache``, up to ``prefix_cache_bytes``), so an episode's
next turn prefills only the environment's answer, not its whole context again; loading new
weights clears them. The contract it implements, and the other engines (``vllm``, ``openai``), are
in ``astraflow.engines``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.engines.base import Engine, Generation, TurnSample
from astraflow.engines.sampling import PREFIX_CACHE_BYTES, PrefixCache, sample

__all__ = ["Generation", "TorchEngine"]


class TorchEngine(Engine):
    """Samples from a transformers causal LM; ``version`` is the weight version it currently holds."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        version: int = 0,
        seed: int | None = None,
        chat_template: bool = False,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    ) -> None:
        super().__init__(tokenizer, version, chat_template)
        self.model = model.eval()
        self.prefix = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._generator = torch.Generator(device=model.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()

    def generate_ids(
        self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False
    ) -> list[TurnSample]:
        """One continuation of each token context, in order, continuing the rows the last call ended
        with where a context extends one (the next turn of a multi-turn episode)."""
        return self._sample(contexts, 1, max_new_tokens, temperature, greedy, self.prefix)

    def sample(
        self, contexts: Sequence[np.ndarray], n: int, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[TurnSample]:
        return self._sample(contexts, n, max_new_tokens, temperature, greedy, None)  # single turns: nothing to keep

    def _sample(
        self,
        contexts: Sequence[np.ndarray],
        n: int,
        max_new_tokens: int,
        temperature: float,
        greedy: bool,
        prefix: PrefixCache | None,
    ) -> list[TurnSample]:
        batch = sample(
            self.model,
            contexts,
            n=n,
            max_new_tokens=max_new_tokens,
            eos_id=self.tokenizer.eos_token_id,
            pad_id=self.tokenizer.pad_token_id,
            temperature=temperature,
            greedy=greedy,
            generator=self._generator,
            prefix=prefix,
        )
        return [
            TurnSample(
                batch.tokens[row, : batch.lengths[row]].copy(),
                batch.logprobs[row, : batch.lengths[row]].copy(),
                bool(batch.stopped[row]),
            )
            for row in range(len(batch.lengths))
        ]

    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap in the weights of ``version`` (a full state dict); call between two ``generate`` calls.

        A state with the model's own names and shapes is copied tensor by tensor, which is what
        ``Module.load_state_dict`` does after its checks and hooks (on the math example's model 1.6 ms
        against 7.8 ms, on every version's critical path); any other state goes through it, and so
        fails with its message."""
        own = self.model.state_dict()
        if own.keys() == state.keys() and all(own[name].shape == tensor.shape for name, tensor in state.items()):
            with torch.no_grad():
                for name, tensor in state.items():
                    own[name].copy_(tensor)
        else:
            self.model.load_state_dict(state)
        self.version = version
        if self.prefix is not None:
            self.prefix.clear()  # keys and values of the old weights
