"""The task feeder's view of the feedback topic: dropped groups to replace, and what the curator learns.

The stream processor writes one PromptStats per group to ``{run}.feedback.{workflow}``. The feeder
reads the topic from its start every time it starts, outside any consumer group: the counts of
dropped groups and the curator's state are functions of the records in order, so reading them all
again rebuilds both (``feeder.py`` says why the curator needs no changelog).
"""

from __future__ import annotations

import time
from collections import Counter

from astraflow.context import ComponentContext
from astraflow.errors import AstraFlowError
from astraflow.log import Message, TopicPartition
from astraflow.producers.curators import Curator
from astraflow.schemas.records import PromptStats


class FeedbackReader:
    """Reads the feedback topic from the start: counts dropped groups per policy and feeds the curator.

    A record that does not decode, or that the curator cannot take in, is dead-lettered and skipped."""

    def __init__(self, ctx: ComponentContext, curator: Curator) -> None:
        self.dropped: Counter[str] = Counter()
        self.curator = curator
        self._ctx = ctx
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
                self._ctx.dead_letter(message, f"undecodable feedback: {exc}", exc)
                continue
            self.dropped[stats.policy] += not stats.accepted
            try:
                self.curator.observe(stats)
            except Exception as exc:  # one record the curator cannot take never stops the feeder
                self._ctx.dead_letter(message, f"feedback the curator rejects: {type(exc).__name__}: {exc}", exc)

    def close(self) -> None:
        self._consumer.close()
