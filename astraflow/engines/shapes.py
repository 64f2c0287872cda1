"""Model shapes that benchmarks and the GPU check build with random weights (nothing is downloaded).

``QWEN2_05B`` is the shape of Qwen2-0.5B (494M parameters with tied embeddings): the size the
memory and speed figures of a real small policy are measured at. ``SMALL_QWEN2`` is a model of the
same architecture small enough for a quick try of those scripts (``--small``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM

QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
)
SMALL_QWEN2 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def random_qwen2(shape: dict, seed: int = 0, max_positions: int = 512) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM of ``shape`` (tied embeddings, fp32, pad id 0, eos id 1)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **shape, tie_word_embeddings=True, max_position_embeddings=max_positions, pad_token_id=0, eos_token_id=1
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
