"""A character-level tokenizer and a tiny Llama causal LM, built locally from a config.

Nothing here touches the Hugging Face Hub: the tokenizer is a ``tokenizers`` WordLevel model over
single characters, wrapped as a ``PreTrainedTokenizerFast`` with ``<pad>``/``<eos>``/``<unk>``, and
the model is a randomly initialised ``LlamaForCausalLM``. Both are written with
``save_pretrained`` so that ``astraflow.engines.loading.load_policy`` loads them exactly like a real
checkpoint. The default size (4 layers, hidden 128, ~1.05M parameters) is the reference model of
the benchmarks (docs/benchmarks.md).

Why Llama and not Qwen2 (the first reference measurements used a Qwen2 of the same shape): transformers 5
``AutoTokenizer`` forces its byte-level ``Qwen2Tokenizer`` on any ``qwen2`` checkpoint, whatever
the saved tokenizer says, which would break a character vocabulary (spaces and newlines vanish).
For ``llama`` it honours the saved ``TokenizersBackend``. The two differ only by Qwen2's QKV bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from astraflow.tasks.arithmetic import ALPHABET

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DEFAULT_ALPHABET = ALPHABET


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny Llama; the defaults give the 1.05M-parameter reference model."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 64
    seed: int = 0


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet`` (ids 3..), after ``<pad>``=0, ``<eos>``=1, ``<unk>``=2.

    No special token is added on encode; decoding concatenates characters (``decoders.Fuse``).
    """
    chars = list(dict.fromkeys(alphabet))
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {char: index + 3 for index, char in enumerate(chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([PAD, EOS, UNK])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec = TinyModelSpec()) -> LlamaForCausalLM:
    """A randomly initialised Llama (tied embeddings, fp32) seeded by ``spec.seed``."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config)


def create_tiny_checkpoint(
    path: str | Path, spec: TinyModelSpec = TinyModelSpec(), alphabet: str = DEFAULT_ALPHABET
) -> Path:
    """Build the tokenizer and a fresh model and ``save_pretrained`` both into ``path``."""
    target = Path(path)
    tokenizer = build_char_tokenizer(alphabet)
    model = build_tiny_model(tokenizer, spec)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
