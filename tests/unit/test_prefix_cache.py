"""Continuing sequences from the keys and values of the last sampling call (``PrefixCache``).

A multi-turn episode's next context is its last one, the turn sampled for it and the environment's
answer. With a ``PrefixCache`` the sampler prefills only the new tokens; these tests check that
what it samples then is what a fresh prefill of the whole context samples (same greedy tokens, the
same log-probs to float noise), that it really skipped the held tokens, and that the cache never
outlives the weights it was computed with.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.engines.sampling import PrefixCache, sample
from astraflow.engines.torch_engine import TorchEngine
from astraflow.episodes.loop import AgentLimits, play
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.search.facts import ALPHABET
from tests.unit.test_multiturn_tokens import Chatter

SPEC = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(tokenizer, SPEC).eval()
    bias = torch.zeros(len(tokenizer))
    bias[tokenizer.eos_token_id] = 3.0  # turns of different lengths: rows leave the batch at different steps
    model.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)
    return model, tokenizer


def run(model, tokenizer, contexts, prefix, **kwargs):
    defaults = {"max_new_tokens": 8, "greedy": True}
    batch = sample(
        model,
        contexts,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        prefix=prefix,
        **(defaults | kwargs),
    )
    return [
        (batch.tokens[row, : batch.lengths[row]], batch.logprobs[row, : batch.lengths[row]])
        for row in range(len(batch.lengths))
    ]


def ids(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)


def test_a_continued_context_samples_what_a_fresh_prefill_of_it_samples(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prefix = PrefixCache(1 << 30)
    first = [ids(tokenizer, text) for text in ("where is 7?", "hi", "a much longer question about 12 and 35")]
    turns = run(model, tokenizer, first, prefix)
    assert prefix.reused == 0 and prefix.prefilled == sum(map(len, first))
    answers = [ids(tokenizer, text) for text in ("\nok\n", "\nno, try again please\n", "\n?\n")]
    second = [np.concatenate([c, t, a]) for c, (t, _), a in zip(first, turns, answers, strict=True)]
    second.append(ids(tokenizer, "a new one"))  # no held prefix: prefilled whole beside the continued rows

    continued = run(model, tokenizer, second, prefix)
    fresh = run(model, tokenizer, second, None)

    held = [len(c) + len(t) - 1 for c, (t, _) in zip(first, turns)]  # a turn's last token was never fed
    assert prefix.reused == sum(held)
    assert prefix.prefilled == sum(map(len, first)) + sum(len(s) for s in second) - sum(held)
    for (tokens, logprobs), (fresh_tokens, fresh_logprobs) in zip(continued, fresh, strict=True):
        np.testing.assert_array_equal(tokens, fresh_tokens)
        np.testing.assert_allclose(logprobs, fresh_logprobs, atol=1e-5)


def test_sampled_turns_and_several_samples_per_prompt_continue_too(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prefix = PrefixCache(1 << 30)
    first = [ids(tokenizer, "count to 3"), ids(tokenizer, "go")]
    turns = run(model, tokenizer, first, prefix, n=2, greedy=False, temperature=1.0,
                generator=torch.Generator().manual_seed(0))  # fmt: skip
    answer = ids(tokenizer, "\nok\n")
    second = [np.concatenate([first[row // 2], tokens, answer]) for row, (tokens, _) in enumerate(turns)]

    continued = run(model, tokenizer, second, prefix, n=3, greedy=False, generator=torch.Generator().manual_seed(1))
    fresh = run(model, tokenizer, second, None, n=3, greedy=False, generator=torch.Generator().manual_seed(1))

    assert prefix.reused > 0
    for (tokens, logprobs), (fresh_tokens, fresh_logprobs) in zip(continued, fresh, strict=True):
        np.testing.assert_array_equal(tokens, fresh_tokens)
        np.testing.assert_allclose(logprobs, fresh_logprobs, atol=1e-5)


def test_the_cache_holds_only_the_last_call_and_nothing_over_its_bound(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prefix = PrefixCache(1 << 30)
    first = [ids(tokenizer, "one question")]
    (turn, _), = run(model, tokenizer, first, prefix)  # fmt: skip
    run(model, tokenizer, [ids(tokenizer, "something else")], prefix)
    reused = prefix.reused
    run(model, tokenizer, [np.concatenate([first[0], turn, ids(tokenizer, "\nok\n")])], prefix)
    assert prefix.reused == reused  # the call in between replaced what the first one left

    tiny = PrefixCache(1)
    (turn, _), = run(model, tokenizer, first, tiny)  # fmt: skip
    run(model, tokenizer, [np.concatenate([first[0], turn, ids(tokenizer, "\nok\n")])], tiny)
    assert tiny.reused == 0


def test_new_weights_clear_the_engines_cache(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    engine = TorchEngine(model, tokenizer, seed=0)
    first = [ids(tokenizer, "where now?")]
    (turn,) = engine.generate_ids(first, 8, 1.0, greedy=True)
    engine.load_state_dict(model.state_dict(), version=1)  # the same weights, but the engine cannot know
    engine.generate_ids([np.concatenate([first[0], turn.ids, ids(tokenizer, "\nok\n")])], 8, 1.0, greedy=True)
    assert engine.prefix.reused == 0


def test_episodes_played_with_the_cache_are_the_episodes_played_without(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    limits = AgentLimits(max_turns=4, max_new_tokens=8, max_total_tokens=96, max_observation_tokens=16)
    tasks = [RolloutTask(f"p{i}@0", f"p{i}", f"p{i}@0", "chat", "", "", 3, 0, 0) for i in range(4)]
    transcripts = []
    engines = (TorchEngine(model, tokenizer, seed=0), TorchEngine(model, tokenizer, seed=0, prefix_cache_bytes=0))
    for engine in engines:
        episodes, failed = play(engine, tasks, lambda task, index: Chatter(), limits, temperature=1.0)
        assert not failed
        transcripts.append([e.transcript.arrays() for e in episodes])
    assert engines[0].prefix.reused > engines[0].prefix.prefilled and engines[1].prefix is None
    (with_cache, without) = transcripts
    assert sum(e.policy_turns for e in episodes) > len(episodes)  # several turns: later ones continued
    for a, b in zip(with_cache, without, strict=True):
        np.testing.assert_array_equal(a[0], b[0])  # the same tokens, sampled with the same generator
        np.testing.assert_allclose(a[1], b[1], atol=1e-5)


def test_a_prompt_given_several_times_is_prefilled_once_and_sampled_as_if_alone(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prompts = [ids(tokenizer, text) for text in ("same start", "other", "same start", "same start")]
    prefix = PrefixCache(1 << 30)
    together = run(model, tokenizer, prompts, prefix, n=2)
    assert prefix.prefilled == len(prompts[0]) + len(prompts[1])
    for row, prompt in enumerate(prompts):
        alone = run(model, tokenizer, [prompt], None, n=2)
        for (tokens, logprobs), (alone_tokens, alone_logprobs) in zip(together[2 * row : 2 * row + 2], alone):
            np.testing.assert_array_equal(tokens, alone_tokens)
            np.testing.assert_allclose(logprobs, alone_logprobs, atol=1e-5)


def test_single_turn_generations_keep_nothing(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    engine = TorchEngine(model, tokenizer, seed=0)
    (generations,) = engine.generate(["where is 7?"], n=4, max_new_tokens=6, temperature=1.0)
    engine.generate_ids([np.concatenate([generations[0].prompt_ids, generations[0].response_ids])], 6, 1.0)
    assert engine.prefix.reused == 0  # a single-turn answer is not continued: keeping its rows would be waste
