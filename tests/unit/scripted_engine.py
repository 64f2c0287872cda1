"""A deterministic ``TokenEngine`` for multi-turn workflow tests: a script writes each policy turn.

``script(context_text)`` returns the text of the next turn; the engine encodes it, appends eos
(the end-of-turn token) and cuts it to the turn's budget, with log-prob -0.5 per token. It records
every context it was asked to continue, so tests can check what the policy conditioned on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from astraflow.engines.base import TurnSample


class ScriptedEngine:
    def __init__(self, tokenizer, script: Callable[[str], str], version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.version = version
        self.contexts: list[np.ndarray] = []

    def generate_ids(
        self, contexts: Sequence[np.ndarray], max_new_tokens: int, temperature: float, greedy: bool = False
    ) -> list[TurnSample]:
        samples = []
        for context in contexts:
            self.contexts.append(np.array(context))
            text = self.script(self.tokenizer.decode(context, skip_special_tokens=True))
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
            cut = ids[:max_new_tokens]
            samples.append(
                TurnSample(
                    np.asarray(cut, dtype=np.int32),
                    np.full(len(cut), -0.5, dtype=np.float32),
                    len(ids) <= max_new_tokens,
                )
            )
        return samples
