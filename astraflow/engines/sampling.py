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

Continuing a sequence (``PrefixCache``): a multi-turn episode's next turn conditions on its last
context, the turn the sampler gave it, and the environment's answer. With a ``PrefixCache`` the
sampler keeps the keys and values of every row it ended with, and a later prompt that extends one
of them prefills only its new tokens: the held rows are left-padded to a common width, the new
tokens follow them (left-padded in their own block, so the attention mask may have holes), and
positions go on from each row's held length. Weights change between versions, so whoever swaps
them clears the cache (``TorchEngine.load_state_dict``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer


@dataclass
class SampledBatch:
    """Responses of one batch, row-aligned with the (repeated) prompts."""

    tokens: np.ndarray  # [N, T] int32, padded with pad_id after each row's length
    logprobs: np.ndarray  # [N, T] float32, 0 after each row's length
    lengths: np.ndarray  # [N] int32, generated tokens per row, eos included
    stopped: np.ndarray  # [N] bool, True when the row sampled eos ("stop"), else it hit the length limit


PREFIX_CACHE_BYTES = 256 << 20
"""Default bound of what a ``PrefixCache`` holds (the keys and values of one call's rows)."""


@dataclass
class _Held:
    """The keys and values of one sequence the sampler ended with, compact (no padding)."""

    ids: np.ndarray  # [L] the tokens the cache holds: the prompt and every fed sampled token
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [heads, L, head_dim]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class PrefixCache:
    """Keys and values of the sequences the last ``sample`` call ended with, up to ``max_bytes``.

    A call's prompts look up their longest held prefix (shorter than the prompt: its last token
    must be fed to give the next logits) and prefill only the rest; at its end the call replaces
    what is held with its own rows. ``prefilled`` and ``reused`` count prompt tokens computed and
    taken from the cache, for the metrics and the tests.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: dict[int, dict[bytes, _Held]] = {}  # by length, then by token bytes
        self.prefilled = 0
        self.reused = 0

    def clear(self) -> None:
        self._held = {}

    def lookup(self, prompt: Sequence[int]) -> _Held | None:
        prompt = np.asarray(prompt, dtype=np.int32)
        for length in sorted(self._held, reverse=True):
            if length < len(prompt):
                held = self._held[length].get(prompt[:length].tobytes())
                if held is not None:
                    return held
        return None

    def replace(self, rows: list[_Held]) -> None:
        self._held, used = {}, 0
        for held in rows:
            used += held.nbytes
            if used > self.max_bytes:
                break
            self._held.setdefault(len(held.ids), {})[held.ids.tobytes()] = held


def _prefill(model: PreTrainedModel, prompts: Sequence[np.ndarray], pad_id: int, prefix: PrefixCache | None):
    """Run the prompts: (output, attention mask [M, W], positions of the last column [M, 1]).

    Without held prefixes: one left-padded forward. With some: the held keys and values, left-padded
    to a common width, then the rest of each prompt in a left-padded block of its own."""
    device = model.device
    held = [prefix.lookup(prompt) for prompt in prompts] if prefix is not None else [None] * len(prompts)
    if not any(held):
        ids, attention = left_pad(prompts, pad_id)
        ids, attention = ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [M, P]
        if prefix is not None:
            prefix.prefilled += sum(len(prompt) for prompt in prompts)
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
        return out, attention, positions[:, -1:]
    lengths = [len(h.ids) if h is not None else 0 for h in held]
    width, rows = max(lengths), len(prompts)
    some = next(h for h in held if h is not None)
    past_mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    layers = []
    for layer, (k0, v0) in enumerate(some.layers):
        keys = k0.new_zeros((rows, k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((rows, v0.shape[0], width, v0.shape[2]))
        for row, h in enumerate(held):
            if h is not None:
                keys[row, :, width - lengths[row] :] = h.layers[layer][0]
                values[row, :, width - lengths[row] :] = h.layers[layer][1]
        layers.append((keys, values))
    for row, length in enumerate(lengths):
        past_mask[row, width - length :] = 1
    ids, new_mask = left_pad([prompt[length:] for prompt, length in zip(prompts, lengths)], pad_id)
    ids, new_mask = ids.to(device), new_mask.to(device)
    starts = torch.as_tensor(lengths, dtype=torch.long, device=device)[:, None]
    positions = starts + (new_mask.cumsum(-1) - 1).clamp(min=0)  # [M, S]
    attention = torch.cat([past_mask, new_mask], dim=-1)
    prefix.reused += sum(lengths)
    prefix.prefilled += int(new_mask.sum())
    out = model(
        input_ids=ids,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=DynamicCache([(k, v) for k, v in layers]),
        use_cache=True,
        logits_to_keep=1,
    )
    return out, attention, positions[:, -1:]


def _plain(cache) -> bool:
    """Whether ``cache`` holds full keys and values per layer, which ``PrefixCache`` can keep (a model
    with sliding-window or recurrent layers keeps other state: its rows are not held)."""
    layers = getattr(cache, "layers", None)
    return isinstance(cache, DynamicCache) and bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _take(cache, attention: torch.Tensor, rows: torch.Tensor) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per row of ``rows`` (indices into the running batch): its keys and values without padding."""
    taken = []
    for row in rows.tolist():
        real = attention[row].bool()
        taken.append([(layer.keys[row][:, real], layer.values[row][:, real]) for layer in cache.layers])
    return taken


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [N, P] left-padded with ``pad_id`` and the attention mask [N, P] (1 = real token)."""
    lengths = np.fromiter((len(prompt) for prompt in prompts), dtype=np.int64, count=len(prompts))
    width = int(lengths.max())
    real = np.arange(width) >= (width - lengths)[:, None]  # [N, P] row-major, so filled in prompt order
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    ids[real] = np.concatenate([np.asarray(prompt, dtype=np.int64).reshape(-1) for prompt in prompts])
    return torch.from_numpy(ids), torch.from_numpy(real.astype(np.int64))


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
    prefix: PrefixCache | None = None,
) -> SampledBatch:
    """Sample ``n`` responses per prompt; row ``i * n + j`` of the result is sample ``j`` of prompt ``i``.

    Each distinct prompt is prefilled once and its KV cache repeated for each of its rows; rows that
    stopped are dropped from the batch, so later steps only compute the rows still running. With ``prefix``, a
    prompt that extends a sequence the last call ended with prefills only its new tokens, and this
    call's rows replace what ``prefix`` holds.
    """
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    device = model.device
    keys = [np.asarray(prompt, dtype=np.int32).tobytes() for prompt in prompts]
    distinct: dict[bytes, int] = {}  # each distinct prompt's first row, in order
    for row, key in enumerate(keys):
        distinct.setdefault(key, row)
    out, attention, positions = _prefill(model, [prompts[row] for row in distinct.values()], pad_id, prefix)
    rows = len(prompts) * n
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    active = torch.arange(rows, device=device)  # [A] result rows still running
    cache = out.past_key_values
    holder = prefix if prefix is not None and _plain(cache) else None  # holds this call's rows at its end
    logits = out.logits[:, -1, :].float()  # [distinct prompts, V]
    if len(distinct) == len(prompts):
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)  # [A, V]
        attention = attention.repeat_interleave(n, dim=0)  # [A, W + step]
        positions = positions.repeat_interleave(n, dim=0)  # [A, 1]
    else:  # a group's episodes start from the same prompt: prefilled once, its rows copied
        order = {key: index for index, key in enumerate(distinct)}
        source = torch.as_tensor([order[key] for key in keys], device=device).repeat_interleave(n)
        cache.batch_select_indices(source)
        logits, attention, positions = logits[source], attention[source], positions[source]
    ended: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # result row -> its held keys and values
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
            if holder is not None:
                stopped = (~keep).nonzero().squeeze(-1)
                ended.update(zip(active[stopped].tolist(), _take(cache, attention, stopped)))
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
    if holder is not None:
        ended.update(zip(active.tolist(), _take(cache, attention, torch.arange(len(active), device=device))))
        sampled, counts = tokens.cpu().numpy(), lengths.cpu().numpy()
        holder.replace(
            [
                _Held(
                    np.concatenate([np.asarray(prompts[row // n], np.int32), sampled[row, : counts[row] - 1]]).astype(
                        np.int32
                    ),
                    ended[row],
                )
                for row in range(rows)
            ]
        )
    last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(-1)
    return SampledBatch(
        tokens=tokens.cpu().numpy().astype(np.int32),
        logprobs=logprobs.cpu().numpy(),
        lengths=lengths.cpu().numpy().astype(np.int32),
        stopped=(last == eos_id).cpu().numpy(),
    )
