"""The search tool: BM25 over SQLite FTS5, the tool-call syntax, the facts task and its environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from astraflow.envs.calls import ToolCall, parse_call
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.search.env import USAGE, SearchEnv
from astraflow.tasks.search.facts import CORPUS_FILE, VALUES, fact_problems, synthetic_facts, write_corpus
from astraflow.tasks.search.index import SearchIndex, SearchIndexError, build_index, query_terms


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> SearchIndex:
    corpus = write_corpus(tmp_path_factory.mktemp("corpus") / CORPUS_FILE, synthetic_facts(seed=3, entities=50))
    return SearchIndex.for_corpus(corpus)


def test_the_fact_is_the_best_match_for_entity_and_attribute(index: SearchIndex) -> None:
    for fact in synthetic_facts(seed=3, entities=50)[:40]:
        [best] = index.search(f"{fact.entity} {fact.attribute}", k=1)
        assert best.doc_id == fact.doc_id and best.text == fact.text


def test_results_are_ranked_by_bm25(index: SearchIndex) -> None:
    fact = synthetic_facts(seed=3, entities=50)[0]
    hits = index.search(f"{fact.entity} {fact.attribute}", k=6)
    assert hits[0].doc_id == fact.doc_id
    assert [h.score for h in hits] == sorted(h.score for h in hits)
    assert {h.text.split()[0] for h in hits[:4]} == {fact.entity}  # the entity's other facts come next


@pytest.mark.parametrize("query", ['"', "a AND", "NEAR(x y)", "*", "col:umn", "zz-(", "'; DROP TABLE docs; --", ""])
def test_model_written_queries_never_reach_the_fts_syntax(index: SearchIndex, query: str) -> None:
    assert isinstance(index.search(query, k=3), list)  # no sqlite3.OperationalError: fts5 syntax error


def test_queries_without_terms_find_nothing(index: SearchIndex) -> None:
    assert index.search("?!( )", k=3) == [] and query_terms("Zorvex CITY zorvex") == ["zorvex", "city"]


def test_the_index_is_rebuilt_when_the_corpus_changes(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"doc_id": "a", "text": "alpha beta"}) + "\n")
    assert SearchIndex.for_corpus(corpus).search("alpha")[0].doc_id == "a"
    corpus.write_text(json.dumps({"doc_id": "b", "text": "gamma alpha"}) + "\n")
    os.utime(corpus, (corpus.stat().st_mtime + 10, corpus.stat().st_mtime + 10))
    assert [h.doc_id for h in SearchIndex.for_corpus(corpus).search("alpha")] == ["b"]


def test_bad_corpus_or_missing_index_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(SearchIndexError, match="cannot index"):
        build_index(tmp_path / "bad.jsonl", tmp_path / "bad.sqlite")
    assert not (tmp_path / "bad.sqlite").exists()
    with pytest.raises(SearchIndexError, match="no search index"):
        SearchIndex(tmp_path / "missing.sqlite")


@pytest.mark.parametrize(
    ("text", "call"),
    [
        ("search(zorvex city)", ToolCall("search", "zorvex city")),
        ("  answer( paris )\n", ToolCall("answer", "paris")),
        ("go(north)", ToolCall("go", "north")),
        ("search zorvex", None),
        ("search(zorvex", None),
        ("", None),
        ("Search(x)", None),
    ],
)
def test_parse_call(text: str, call: ToolCall | None) -> None:
    assert parse_call(text) == call


def test_fact_problems_are_deterministic_and_answerable_only_from_the_corpus(tmp_path: Path) -> None:
    train, heldout = fact_problems(seed=1, heldout_size=40, data_dir=tmp_path / "a", entities=30)
    again, _ = fact_problems(seed=1, heldout_size=40, data_dir=tmp_path / "b", entities=30)
    assert train == again and len(train) + len(heldout) == 30 * len(VALUES)
    assert not {p.prompt_id for p in train} & {p.prompt_id for p in heldout}
    docs = {json.loads(line)["text"] for line in (tmp_path / "a" / CORPUS_FILE).read_text().splitlines()}
    for problem in heldout:
        attribute, entity = problem.prompt[:-2].split(" of ")
        assert f"{entity} {attribute} {problem.answer}" in docs and problem.prompt.endswith("?\n")


def task(prompt: str, answer: str) -> RolloutTask:
    return RolloutTask("t@0", "t", "t@0", "search", prompt, answer, 1, 0, 0)


def test_search_env_episode(index: SearchIndex) -> None:
    fact = synthetic_facts(seed=3, entities=50)[5]
    env = SearchEnv(task(f"{fact.attribute} of {fact.entity}?\n", fact.value), index, top_k=1)
    assert env.reset() == f"{fact.attribute} of {fact.entity}?\n"
    assert env.step("look around").observation == USAGE
    assert env.step(f"search({fact.entity} {fact.attribute})").observation == f"\n{fact.text}\n"
    assert env.step("search(?!)").observation == "\nno results\n"
    assert env.step(f"answer({fact.value})").done
    assert env.reward() == {"reward": 1.0, "correct": 1.0, "answered": 1.0, "searches": 2.0}


@pytest.mark.parametrize(("actions", "reward"), [(["answer(nowhere)"], 0.0), (["search(x)"], 0.0), ([], 0.0)])
def test_search_env_wrong_or_missing_answers_score_zero(index: SearchIndex, actions: list[str], reward: float) -> None:
    env = SearchEnv(task("city of x?\n", "paris"), index)
    for action in actions:
        env.step(action)
    assert env.reward()["reward"] == reward
