"""The task feeder's view of the feedback topic: dropped groups to replace, and what the curator learns.

The stream processor writes one PromptStats per group to ``{run}.feedback.{workflow}``, and the
trainer one more for a group it found stale. The feeder reads the topic from its start every time
it starts, outside any consumer group: the counts of dropped groups and the curator's state are
functions of the records in order, so reading them all again rebuilds both (``component.py`` says why
the curator needs no changelog).

A record that does not decode, or whose fields no stream or trainer writes (``schemas.validation.
feedback_problem``: a NaN or out-of-range pass rate, an unknown policy, an empty or oversized id, ...)
is dead-lettered with the field at fault and counts for nothing: neither as a dropped group, which
would release a task no group left open, nor for the curator, whose per-prompt state it would bend
for good.

What counts, per group id (the newest ``REMEMBER_GROUPS`` ids are remembered):

- the curator observes a group's first record only: a copy (a stream runtime that emitted a
  group twice across a crash) or the trainer's verdict after the stream's would weigh its prompt
  twice;
- a group gives a task back once, on its first record with ``accepted`` false: a copy of a
  dropped group's record must not release a task that no dropped group left open. Each such
  task is a group more than the trainers can take, and that surplus never drains (it waits in
  the samples topic, every batch a little staler);
- a group dropped as ``stale`` gives nothing back where the policy's ``max_staleness`` is 0: a
  group can only go stale there once its trainer moved on without it, that is, it was surplus.
  With a larger bound, a slow group goes stale while the trainer rightly trains others, and its
  task is given back.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict

from astraflow.core.errors import AstraFlowError
from astraflow.log import Message, TopicPartition
from astraflow.producers.feeder.curators import Curator
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import PromptStats
from astraflow.schemas.validation import clipped, feedback_problem

REMEMBER_GROUPS = 200_000
"""Group ids the reader remembers (module docstring): copies and the trainer's verdicts follow their
group's first record by a few batches, not by hundreds of thousands of groups."""


class FeedbackReader:
    """Reads the feedback topic from the start: counts dropped groups per policy and feeds the curator.

    ``replace_stale``: per policy, whether a group dropped as stale gives its task back (module
    docstring; every policy does when it is not given). A record that does not decode, or that the
    curator cannot take in, is dead-lettered and skipped."""

    def __init__(self, ctx: ComponentContext, curator: Curator, replace_stale: dict[str, bool] | None = None) -> None:
        self.dropped: Counter[str] = Counter()
        self.copies = 0
        """Records of a group already counted: copies, or the trainer's verdict on an accepted group."""
        self.curator = curator
        self._replace_stale = replace_stale or {}
        self._groups: OrderedDict[str, bool] = OrderedDict()
        """Group id → whether it gave a task back already."""
        self._ctx = ctx
        self._policies = tuple(ctx.config.policy_names())
        self._max_abs_reward = {p: ctx.config.for_policy(p).stream.max_abs_reward for p in self._policies}
        self.rejected = 0
        """Records dead-lettered as undecodable or invalid."""
        self._codec = ctx.codec
        self._partition = TopicPartition(ctx.topics.feedback(), 0)
        self._consumer = ctx.log.consumer(group_id=None)
        self._consumer.assign([self._partition])
        self._consumer.seek_to_beginning()

    def catch_up(self, timeout: float = 300.0) -> None:
        """Take in every record the topic holds now, so that the first round is decided on all of it."""
        end = self._ctx.log.end_offsets(self._partition.topic).get(0, 0)
        deadline = time.monotonic() + timeout
        while self._consumer.position(self._partition) < end:
            if time.monotonic() > deadline:
                raise AstraFlowError(
                    f"could not read {self._partition.topic} up to offset {end} within {timeout:.0f} s"
                )
            self._take(self._consumer.poll(max_records=1000, timeout=0.2))

    def update(self) -> Counter[str]:
        self._take(self._consumer.poll(max_records=1000, timeout=0.0))
        return self.dropped

    def _take(self, messages: list[Message]) -> None:
        for message in messages:
            try:
                stats = self._codec.decode(message.value, expect=PromptStats)
            except AstraFlowError as exc:
                self.rejected += 1
                self._ctx.dead_letter(message, f"undecodable feedback: {exc}", exc)
                continue
            problem = feedback_problem(stats, self._policies, self._max_abs_reward.get(stats.policy, math.inf))
            if problem is not None:
                self.rejected += 1
                self._ctx.dead_letter(message, f"invalid feedback of group {clipped(stats.group_id)}: {problem}")
                continue
            key = f"{stats.policy}\x1f{stats.group_id}"
            known = key in self._groups
            if known:
                self.copies += 1
            replaced = self._groups.get(key, False)
            if not stats.accepted and not replaced:
                stale = stats.drop_reason.startswith("stale")
                replaced = not stale or self._replace_stale.get(stats.policy, True)
                self.dropped[stats.policy] += replaced
            self._groups[key] = replaced
            self._groups.move_to_end(key)
            if len(self._groups) > REMEMBER_GROUPS:
                self._groups.popitem(last=False)
            if known:
                continue
            try:
                self.curator.observe(stats)
            except Exception as exc:  # one record the curator cannot take never stops the feeder
                self._ctx.dead_letter(message, f"feedback the curator rejects: {type(exc).__name__}: {exc}", exc)

    def close(self) -> None:
        self._consumer.close()
