"""Retention of weight versions (``weights.keep_versions``, 8 by default): the last K versions, and the full one
they need.

A delta is only readable on top of its base, so "the last K versions" really means the last K
versions plus the chain back to the newest full version at or before the oldest of them. The
publisher records, for every version it sends, where its records start on the weights topic and
(with ``transport: store``) its stored chunks' URI; after each publish it cuts everything older
than that full version:

1. the topic is truncated below the full version's first records (``Log.delete_records``, on both
   partitions), so a reader that starts late begins at a full version;
2. with a store, the stored chunks of the dropped versions are deleted, and so is any other stored
   version of the topic not kept (left behind by an earlier run of the trainer).

Deleting happens after the new version's manifest is visible (flushed, or its transaction
committed), so the newest version is always whole, and a fenced trainer, whose transaction never
commits, deletes nothing. A reader that is still fetching a dropped version finds it gone, logs it, and waits for the
next full version; it never applies a part of one.
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.log import Log
from astraflow.weights.store import ChunkStore


@dataclass(frozen=True)
class KeptVersion:
    version: int
    full: bool
    start: dict[int, int]
    """Per partition of the weights topic, the offset of the version's first record."""
    uri: str | None
    """Its stored chunks (``transport: store``), or ``None``."""


class VersionRetention:
    """Keeps the newest ``keep`` versions of one weights topic (plus their full base), deletes the rest."""

    def __init__(self, keep: int, log: Log, topic: str, store: ChunkStore | None) -> None:
        self.keep = keep
        self.log = log
        self.topic = topic
        self.store = store
        self.kept: list[KeptVersion] = []

    def published(self, version: KeptVersion) -> None:
        """Record a version that is now on the log, and delete what no kept version needs any more."""
        self.kept.append(version)
        oldest = max(len(self.kept) - self.keep, 0)
        first = max(i for i in range(oldest + 1) if self.kept[i].full)  # a publisher's first version is full
        dropped, self.kept = self.kept[:first], self.kept[first:]
        if not dropped:
            return
        self.log.delete_records(self.topic, self.kept[0].start)
        if self.store is not None:
            self.store.delete([v.uri for v in dropped if v.uri])
            self.store.sweep(self.topic, [v.uri for v in self.kept if v.uri])
