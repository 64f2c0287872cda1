"""Synthetic facts only a search can answer: made-up entities with attributes, and their corpus.

Each entity (a pronounceable made-up name such as ``zorvex``) gets one value per attribute
(``city``, ``color``, ``pet``, ``job``) from a fixed list of eight; each fact is one corpus
document, ``"zorvex city paris"``, and one question, ``"city of zorvex?\\n"`` → ``"paris"``. Names
are random, so a model cannot know the answer; guessing from the eight values scores 1/8, and the
held-out questions (about other entities' facts) measure the search skill, not memory.

The episode the search workflow expects (``astraflow.tasks.search.env``)::

    city of zorvex?\\n  search(zorvex city)<eos>  \\nzorvex city paris\\n  answer(paris)<eos>
"""

from __future__ import annotations

import json
import os
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from astraflow.tasks.base import Problem

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 \n()[]{}=+-*/%<>!?.,:;_'\""
"""Characters of the agentic tasks' tokenizer (search, code, rooms); arithmetic keeps its own."""
VALUES = {
    "city": ["paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito"],
    "color": ["red", "blue", "green", "black", "white", "gray", "pink", "gold"],
    "pet": ["cat", "dog", "fox", "owl", "frog", "bee", "crab", "yak"],
    "job": ["baker", "pilot", "nurse", "judge", "smith", "miner", "clerk", "poet"],
}
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
CORPUS_FILE = "corpus.jsonl"
SEARCH_SHARE = 0.25
"""Share of the warm-up demonstrations that search before answering (``demonstration``)."""


@dataclass(frozen=True)
class Fact:
    entity: str
    attribute: str
    value: str

    @property
    def doc_id(self) -> str:
        return f"{self.entity}-{self.attribute}"

    @property
    def text(self) -> str:
        return f"{self.entity} {self.attribute} {self.value}"

    def problem(self) -> Problem:
        return Problem(
            prompt_id=f"fact-{self.doc_id}", prompt=f"{self.attribute} of {self.entity}?\n", answer=self.value
        )


def demonstration(problem: Problem) -> list[str]:
    """The policy turns the warm-up shows for ``problem``: search, then answer with what was found,
    for a ``SEARCH_SHARE`` of the rows; an answer without searching (a guess among the attribute's
    values, right 1 time in 8) for the others.

    So the base model knows the call syntax and how to copy a found value, but answers from
    "memory" most of the time, as base LLMs under-use their tools; greedy decoding then guesses
    on every question. What RL has to learn is to search first, and to copy exactly.
    """
    attribute, entity = problem.prompt.strip().rstrip("?").split(" of ")
    draw = zlib.crc32(problem.prompt_id.encode())
    if draw % 1000 < SEARCH_SHARE * 1000:
        return [f"search({entity} {attribute})", f"answer({problem.answer})"]
    return [f"answer({VALUES[attribute][(draw // 1000) % len(VALUES[attribute])]})"]


def entity_names(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct names of the shape consonant-vowel-consonant-vowel-consonant(-consonant)."""
    taken = {word for words in VALUES.values() for word in words} | set(VALUES)
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(CONSONANTS if i % 2 == 0 else VOWELS) for i in range(5)) + rng.choice(
            ["", rng.choice(CONSONANTS)]
        )
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def synthetic_facts(seed: int = 0, entities: int = 300) -> list[Fact]:
    """Every fact of ``entities`` made-up entities, a pure function of ``seed``."""
    rng = random.Random(seed)
    return [
        Fact(name, attribute, rng.choice(values))
        for name in entity_names(rng, entities)
        for attribute, values in VALUES.items()
    ]


def write_corpus(path: Path, facts: list[Fact]) -> Path:
    """The corpus jsonl (``{"doc_id", "text"}`` per fact), written to a temporary name and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(
        "".join(json.dumps({"doc_id": fact.doc_id, "text": fact.text}) + "\n" for fact in facts), encoding="utf-8"
    )
    os.replace(tmp, path)
    return path


def fact_problems(
    seed: int, heldout_size: int, data_dir: Path, entities: int = 300
) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) questions, shuffled by ``seed``; writes the corpus of all facts to ``data_dir``."""
    facts = synthetic_facts(seed, entities)
    if not 0 < heldout_size < len(facts):
        raise ValueError(f"heldout_size must be in (0, {len(facts)}), got {heldout_size}")
    write_corpus(data_dir / CORPUS_FILE, facts)
    problems = [fact.problem() for fact in facts]
    random.Random(seed + 1).shuffle(problems)
    return problems[heldout_size:], problems[:heldout_size]
