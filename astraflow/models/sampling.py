"""Batched autoregressive sampling with a KV cache, returning each token's behaviour log-prob.

Our own loop rather than ``model.generate``: it returns the log-prob of every sampled token in one
pass, costs less per step on tiny models, and states its log-prob convention exactly.

Log-prob convention: a sampled token's log-prob is ``log_softmax(logits / T)`` at the sampling
temperature ``T``, i.e. the log-prob under the distribution the token was actually drawn from (the
behaviour policy). The trainer scores tokens with the same temperature, so the importance ratio is
exactly 1 on-policy. (vLLM's default ``logprobs`` are of the raw logits; its
``logprobs_mode="processed_logprobs"`` gives this convention.) Greedy decoding reports the T = 1
log-probs of the argmax tokens.

Layout: prompts are left-padded to a common length; position ids count real tokens only, so a row's
positions are the same as if it had been run alone. A row stops after it samples ``eos_id`` (the
eos token is part of its response) or after ``max_new_tokens``; the rest of its row is ``pad_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel


@dataclass
class SampledBatch:
    """Responses of one batch, row-aligned with the (repeated) prompts."""

    tokens: np.ndarray  # [N, T] int32, padded with pad_id after each row's length
    logprobs: np.ndarray  # [N, T] float32, 0 after each row's length
    lengths: np.ndarray  # [N] int32, generated tokens per row, eos included
    stopped: np.ndarray  # [N] bool, True when the row sampled eos ("stop"), else it hit the length limit


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [N, P] left-padded with ``pad_id`` and the attention mask [N, P] (1 = real token)."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            ids[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
    return ids, mask


@torch.inference_mode()
def sample(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    *,
    n: int = 1,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> SampledBatch:
    """Sample ``n`` responses per prompt; row ``i * n + j`` of the result is sample ``j`` of prompt ``i``.

    Each prompt is prefilled once and its KV cache repeated ``n`` times; rows that stopped are
    dropped from the batch, so later steps only compute the rows still running.
    """
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    device = model.device
    ids, attention = left_pad(prompts, pad_id)
    ids, attention = ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [M, P]
    rows = ids.shape[0] * n
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    active = torch.arange(rows, device=device)  # [A] result rows still running
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1, :].float().repeat_interleave(n, dim=0)  # [A, V]
    attention = attention.repeat_interleave(n, dim=0)  # [A, P + step]
    positions = positions[:, -1:].repeat_interleave(n, dim=0)  # [A, 1]
    for step in range(max_new_tokens):
        if greedy:
            chosen = logits.argmax(-1)  # [A]
            logp = torch.log_softmax(logits, -1)  # [A, V]
        else:
            logp = torch.log_softmax(logits / temperature, -1)
            chosen = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        tokens[active, step] = chosen
        logprobs[active, step] = logp.gather(-1, chosen[:, None]).squeeze(-1)
        lengths[active] += 1
        keep = chosen != eos_id  # [A]
        if step == max_new_tokens - 1 or not keep.any():
            break
        if not keep.all():
            kept = keep.nonzero().squeeze(-1)
            cache.batch_select_indices(kept)
            active, chosen, attention, positions = active[kept], chosen[kept], attention[kept], positions[kept]
        attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=-1)
        positions = positions + 1
        out = model(
            input_ids=chosen[:, None],
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
    last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(-1)
    return SampledBatch(
        tokens=tokens.cpu().numpy().astype(np.int32),
        logprobs=logprobs.cpu().numpy(),
        lengths=lengths.cpu().numpy().astype(np.int32),
        stopped=(last == eos_id).cpu().numpy(),
    )
