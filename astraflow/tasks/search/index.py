"""A retrieval tool: BM25 over a local corpus in an SQLite FTS5 index.

The corpus is a jsonl file of ``{"doc_id", "text"}`` rows (the search example generates one). The
index is built once next to it (``corpus.sqlite``: written to a temporary name and renamed into
place, so several producers may build it at once) and opened read-only by every episode.

Queries come from the model, so they are never passed to FTS5's query language: they are cut into
word terms (``[a-z0-9]+``, lower-cased) and OR-ed as quoted phrases, and BM25 (FTS5's ``bm25()``,
k1 = 1.2, b = 0.75) ranks every document that holds any term. A query with no terms finds nothing;
that is an answer to the model ("no results"), not an error.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from astraflow.core.errors import AstraFlowError

TERM = re.compile(r"[a-z0-9]+")


class SearchIndexError(AstraFlowError):
    """The corpus or its index cannot be read or built."""


@dataclass(frozen=True)
class Hit:
    """One retrieved document; a lower ``score`` is a better match (FTS5's bm25 sign)."""

    doc_id: str
    text: str
    score: float


def query_terms(query: str, max_terms: int = 16) -> list[str]:
    """The words of a model-written query, in order, without duplicates."""
    return list(dict.fromkeys(TERM.findall(query.lower())))[:max_terms]


def build_index(corpus: Path, index: Path) -> Path:
    """Index the jsonl ``corpus`` into the FTS5 database ``index`` (atomically); returns ``index``."""
    tmp = index.with_name(f".{index.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        with sqlite3.connect(tmp) as db, corpus.open(encoding="utf-8") as rows:
            db.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, text, tokenize='unicode61')")
            db.executemany(
                "INSERT INTO docs (doc_id, text) VALUES (?, ?)", (_row(line) for line in rows if line.strip())
            )
        db.close()
        os.replace(tmp, index)
    except (OSError, sqlite3.Error, ValueError, KeyError) as exc:
        tmp.unlink(missing_ok=True)
        raise SearchIndexError(f"cannot index {corpus}: {exc}") from exc
    return index


def _row(line: str) -> tuple[str, str]:
    row = json.loads(line)
    return str(row["doc_id"]), str(row["text"])


class SearchIndex:
    """Read-only BM25 search over an index written by ``build_index``.

    One read-only connection, shared by the workflow's tool threads behind a lock (a query takes
    well under a millisecond; ``sqlite3`` connections are not safe to share in every build).
    """

    def __init__(self, index: Path) -> None:
        if not index.is_file():
            raise SearchIndexError(f"no search index at {index}")
        self.path = index
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(f"file:{index}?mode=ro", uri=True, check_same_thread=False)
        except sqlite3.Error as exc:
            raise SearchIndexError(f"cannot open the search index {index}: {exc}") from exc

    @classmethod
    def for_corpus(cls, corpus: Path) -> "SearchIndex":
        """The index of ``corpus`` (``<corpus stem>.sqlite`` beside it), built first if missing or older."""
        index = corpus.with_suffix(".sqlite")
        if not index.is_file() or index.stat().st_mtime < corpus.stat().st_mtime:
            build_index(corpus, index)
        return cls(index)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The ``k`` best documents for ``query`` by BM25, best first."""
        terms = query_terms(query)
        if not terms:
            return []
        match = " OR ".join(f'"{term}"' for term in terms)
        try:
            with self._lock:
                rows = self._db.execute(
                    "SELECT doc_id, text, bm25(docs) AS score FROM docs "
                    "WHERE docs MATCH ? ORDER BY score, doc_id LIMIT ?",
                    (match, k),
                ).fetchall()
        except sqlite3.Error as exc:
            raise SearchIndexError(f"search of {self.path} failed for {match!r}: {exc}") from exc
        return [Hit(doc_id, text, float(score)) for doc_id, text, score in rows]

    def close(self) -> None:
        self._db.close()
