"""System accuracy of an answering policy checked by a judging policy (issue 6).

For each held-out prompt the answerer proposes ``k`` answers: its greedy answer first, then
``k − 1`` samples at its temperature. The judge reads ``<prompt><answer>?`` greedily for each; the
system answers with the first candidate the judge accepts (``1``), or the greedy answer when it
accepts none; the judge accepts a candidate when the answer it writes is that candidate
(``tasks.arithmetic.judgement``). ``alone`` is the greedy answer's accuracy (what the answerer scores by itself, the
same number its own evaluator reports), ``judged`` the system's, so ``judged − alone`` is the
collaborative gain; ``pass_at_k`` bounds it, and ``judge_accuracy`` is how often the judge's
verdict on a candidate was right. ``majority`` is the obvious baseline that needs no judge: the
answer most of the same k candidates give (ties to the earliest, so the greedy answer first), i.e.
self-consistency; a judge is worth training only where ``judged`` beats it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from astraflow.engines.torch_engine import TorchEngine
from astraflow.tasks.arithmetic import exact_match_reward, extract_answer, judge_prompt, judgement
from astraflow.tasks.base import Problem


@dataclass(frozen=True)
class SystemAccuracy:
    alone: float
    judged: float
    pass_at_k: float
    judge_accuracy: float
    majority: float


def pick(candidates: Sequence[str], verdicts: Sequence[bool]) -> str:
    """The first candidate the judge accepts; the first candidate when it accepts none; the judge
    accepts a candidate when the answer it writes is that candidate (``tasks.arithmetic.judgement``)."""
    return next((c for c, v in zip(candidates, verdicts, strict=True) if v), candidates[0])


def majority(candidates: Sequence[str]) -> str:
    """The answer given most often among ``candidates``; of equally frequent ones, the earliest."""
    counts = Counter(candidates)
    return max(candidates, key=lambda c: (counts[c], -candidates.index(c)))


def _texts(
    engine: TorchEngine, prompts: list[str], n: int, max_new_tokens: int, greedy: bool, temperature: float
) -> list[str]:
    """The answers in ``n`` responses to each prompt, sampled by ``engine`` (greedy ones use no randomness)."""
    turns = engine.sample(engine.encode(prompts), n, max_new_tokens, temperature, greedy)
    texts = engine.tokenizer.batch_decode([turn.ids for turn in turns], skip_special_tokens=True)
    return [extract_answer(text) for text in texts]


@torch.no_grad()
def evaluate_system(
    answerer: PreTrainedModel,
    judge: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    k: int,
    answer_tokens: int,
    judge_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> SystemAccuracy:
    """Score the answerer alone and checked by the judge on ``problems`` (both models in eval mode)."""
    answering = TorchEngine(answerer, tokenizer, seed=seed, prefix_cache_bytes=0)  # both in eval mode
    judging = TorchEngine(judge, tokenizer, prefix_cache_bytes=0)
    prompts = [p.prompt for p in problems]
    greedy = _texts(answering, prompts, 1, answer_tokens, True, 1.0)
    sampled = _texts(answering, prompts, k - 1, answer_tokens, False, temperature) if k > 1 else []
    candidates = [[greedy[i], *sampled[i * (k - 1) : (i + 1) * (k - 1)]] for i in range(len(problems))]
    judged_prompts = [judge_prompt(p.prompt, c) for p, cs in zip(problems, candidates, strict=True) for c in cs]
    flat = [c for cs in candidates for c in cs]
    verdicts = [
        judgement(text, c)
        for text, c in zip(_texts(judging, judged_prompts, 1, judge_tokens, True, 1.0), flat, strict=True)
    ]
    alone = judged = solved = right_verdicts = voted = 0.0
    for i, (problem, cs) in enumerate(zip(problems, candidates, strict=True)):
        mine = verdicts[i * k : (i + 1) * k]
        correct = [exact_match_reward(c, problem.answer) > 0 for c in cs]
        alone += correct[0]
        judged += exact_match_reward(pick(cs, mine), problem.answer)
        voted += exact_match_reward(majority(cs), problem.answer)
        solved += any(correct)
        right_verdicts += sum(v == c for v, c in zip(mine, correct))
    n = max(len(problems), 1)
    return SystemAccuracy(alone / n, judged / n, solved / n, right_verdicts / (n * k), voted / n)
