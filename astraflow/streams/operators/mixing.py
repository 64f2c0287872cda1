"""Mixers: after a group is accepted, the extra groups to emit with it.

Replay (``ReplayMixer``): a share ρ of the emitted samples is drawn from a bounded buffer of
recently accepted groups, the rest are fresh (docs/algorithms.md). The trainer cuts batches from the
sample stream, so the mixer does not see batch boundaries; it keeps a credit instead: every fresh
sample earns ρ / (1 − ρ) replayed samples, and whole buffered groups are emitted while the credit
covers them. Over any run of fresh groups the replayed share is ρ to within one group, so a batch
of B samples holds ⌊ρ·B⌋ replayed samples up to one group's size.

A replayed group is a copy of the accepted one, with the advantages computed when it was
accepted; its sample ids get ``#replay<n>`` appended (the trainer drops repeated ids) and its
samples are marked ``replayed``. Its tokens only grow older: the trainer's off-policy correction
against the behaviour log-probs applies to it like to any stale sample.

The buffer, the credit and the random generator are the replay mixer's state (``state_dict``),
which the native runtime journals with its commits: a restarted processor replays the same copies,
with the same ``#replay<n>`` ids, as one that never stopped. The state names each buffered group's
trajectories by their position in the trajectories topic (they are there anyway) and carries only
what the operators computed: advantages and provenance. A buffered group whose records retention
deleted meanwhile is left out of the restored buffer.

The offline mixer's state is its credit and the groups its ``OfflineSource`` fed it that were not
emitted yet, named by their position in the offline topic; the source (``streams.offline``)
journals its own position beside it.
"""

from __future__ import annotations

import json
import logging
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from astraflow.streams.operators.base import Group, TrajectoryLookup, register

logger = logging.getLogger(__name__)


def saved_group(group: Group, **extra: object) -> dict:
    """A group as a mixer's state keeps it: its members by position, and what the operators computed."""
    advantages = None if group.advantages is None else group.advantages.tolist()
    tokens = None if group.token_advantages is None else [a.tolist() for a in group.token_advantages]
    return {
        "group": group.group_id,
        "positions": group.positions,
        "advantages": advantages,
        "token_advantages": tokens,
        "operators": group.operators,
        **extra,
    }


def restored_groups(entries: list[dict], lookup: TrajectoryLookup, owner: str) -> Iterator[tuple[dict, Group]]:
    """Each ``saved_group`` entry with its group rebuilt from the records ``lookup`` reads, in one
    pass; an entry whose records retention deleted is left out (logged as ``owner``'s)."""
    trajectories = iter(lookup([(p, o) for entry in entries for p, o in entry["positions"]]))
    for entry in entries:
        members = [next(trajectories) for _ in entry["positions"]]
        if not members or None in members:
            logger.warning("%s: group %s left out, its records are gone", owner, entry["group"])
            continue
        advantages = None if entry["advantages"] is None else np.asarray(entry["advantages"], dtype=np.float32)
        saved = entry.get("token_advantages")  # absent from states saved before step-level advantages
        tokens = None if saved is None else [np.asarray(a, dtype=np.float32) for a in saved]
        positions = [(p, o) for p, o in entry["positions"]]
        yield (
            entry,
            Group(
                entry["group"],
                members,
                advantages,
                list(entry["operators"]),
                positions=positions,
                token_advantages=tokens,
            ),
        )


@register
class ReplayMixer:
    """Emits replayed copies of recent accepted groups so that they make up ``ratio`` of the samples."""

    name = "replay"

    def __init__(self, ratio: float = 0.3, capacity: int = 64, selector: str = "latest", seed: int = 0) -> None:
        self.ratio = ratio
        self.selector = selector
        self._rng = random.Random(seed)
        self._buffer: deque[list] = deque(maxlen=capacity)  # [group as accepted, times replayed]
        self._credit = 0.0  # replayed samples owed

    def mix(self, group: Group) -> list[Group]:
        if self._buffer:  # nothing is owed for the groups that found the buffer empty
            self._credit += len(group.trajectories) * self.ratio / (1.0 - self.ratio)
        extra: list[Group] = []
        while self._buffer:
            entry = self._pick(len(extra))
            stored: Group = entry[0]
            if len(stored.trajectories) > self._credit:
                break
            entry[1] += 1
            self._credit -= len(stored.trajectories)
            extra.append(replace(stored, operators=list(stored.operators), replay=entry[1]))
        self._buffer.append([replace(group, operators=list(group.operators)), 0])
        return extra

    def _pick(self, drawn: int) -> list:
        """``latest``: the most recent groups in turn (cycling); ``uniform``: any, with replacement."""
        if self.selector == "latest":
            return self._buffer[-1 - drawn % len(self._buffer)]
        return self._buffer[self._rng.randrange(len(self._buffer))]

    def state_dict(self) -> bytes:
        buffered = [saved_group(group, replayed=replayed) for group, replayed in self._buffer]
        rng = None if self.selector == "latest" else self._rng.getstate()  # ``latest`` never draws
        return json.dumps({"credit": self._credit, "rng": rng, "buffer": buffered}).encode()

    def load_state_dict(self, state: bytes, lookup: TrajectoryLookup) -> None:
        saved = json.loads(state)
        self._credit = float(saved["credit"])
        if saved["rng"] is not None:
            version, internal, gauss = saved["rng"]
            self._rng.setstate((version, tuple(internal), gauss))
        self._buffer.clear()
        for entry, group in restored_groups(saved["buffer"], lookup, "replay buffer"):
            self._buffer.append([group, int(entry["replayed"])])


@register
class OfflineMixer:
    """Emits groups of another trajectory topic so that they make up ``weight`` of the samples.

    The mixer holds no I/O: the runtime reads the topic (``streams.offline.OfflineSource``), runs
    its completed groups through the group operators (all but ``staleness``: their token versions
    count another run's steps) and ``feed``-s the accepted ones here, as many as ``demand`` asks
    for. The credit works like the replay mixer's: every fresh sample earns weight / (1 − weight)
    offline samples, paid in whole groups. A fresh group that finds nothing fed (the topic is used
    up, or behind) earns nothing, so a topic that grows again later is not owed a burst.
    """

    name = "offline"

    def __init__(self, topic: str, weight: float = 0.3, source: str | None = None, loop: bool = False) -> None:
        self.topic = topic
        self.weight = weight
        self.source = source
        self.loop = loop
        self._ready: deque[Group] = deque()
        self._credit = 0.0  # offline samples owed
        self._unresolved: list[dict] = []  # fed groups of a loaded state, until ``resolve``

    def demand(self, fresh_samples: int) -> float:
        """Offline samples to have fed before ``fresh_samples`` more fresh samples are mixed."""
        owed = self._credit + fresh_samples * self.weight / (1.0 - self.weight)
        return owed - sum(len(group.trajectories) for group in self._ready)

    def feed(self, group: Group) -> None:
        self._ready.append(group)

    def mix(self, group: Group) -> list[Group]:
        if not self._ready:
            self._credit = 0.0
            return []
        self._credit += len(group.trajectories) * self.weight / (1.0 - self.weight)
        extra: list[Group] = []
        while self._ready and len(self._ready[0].trajectories) <= self._credit:
            offline = self._ready.popleft()
            self._credit -= len(offline.trajectories)
            extra.append(offline)
        return extra

    @property
    def pending(self) -> list[Group]:
        """Fed groups not emitted yet."""
        return list(self._ready)

    def state_dict(self) -> bytes:
        ready = [saved_group(group, origin=group.origin) for group in self._ready]
        return json.dumps({"credit": self._credit, "ready": ready}).encode()

    def load_state_dict(self, state: bytes, lookup: TrajectoryLookup) -> None:
        """The credit now; the fed groups once their ``OfflineSource`` ``resolve``-s them: their
        records are in the offline topic, which ``lookup`` (the runtime's input topic) does not read."""
        saved = json.loads(state)
        self._credit = float(saved["credit"])
        self._ready.clear()
        self._unresolved = saved["ready"]

    def resolve(self, lookup: TrajectoryLookup) -> None:
        """Rebuild the fed groups of the state loaded, reading their members with ``lookup``."""
        entries, self._unresolved = self._unresolved, []
        for entry, group in restored_groups(entries, lookup, "offline mixer"):
            group.origin = entry["origin"]
            self._ready.append(group)
