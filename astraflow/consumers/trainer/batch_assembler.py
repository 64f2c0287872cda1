"""Cuts a policy's sample stream into batches of whole groups, strictly in the order read.

A batch is a prefix of what was read, and each samples partition arrives in offset order, so a
batch covers, per partition, every record below its last one there that no earlier batch took.
Stale groups in that prefix (generated before the oldest version the trainer may train on) are
consumed with it but trained in no batch: the bound ``max_staleness`` holds where it matters, at
the optimizer step, even for samples that waited in the samples topic after the stream passed them.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable

from astraflow.core.errors import AstraFlowError, error_reason
from astraflow.log import Log, Message, TopicPartition
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import TrainSample
from astraflow.schemas.validation import clipped, id_problem

Reject = Callable[[Message, str, BaseException | None], None]
"""Dead-letters a message with a reason (and the error behind it): ``Trainer._reject``."""


COPY_SUFFIX = re.compile(r"(#offline[0-9]+)?(#replay[0-9]+)?")
"""What the stream appends to a trajectory id for a sample id (``streams.operators.base.Group.copy_suffix``)."""
REPLAY_COPY = re.compile(r"#replay[0-9]+$")
"""A replay mixer's copy, by its ``copy_id``."""


def note_newest(seen: OrderedDict[str, None], key: str, limit: int) -> bool:
    """Add ``key`` to ``seen``, which keeps the newest ``limit`` keys; False when it was there already."""
    if key in seen:
        return False
    seen[key] = None
    if len(seen) > limit:
        seen.popitem(last=False)
    return True


def copy_id(sample: TrainSample) -> str:
    """The copy of a group ``sample`` belongs to: its group id with the stream's suffix of the sample id
    (``#offline<pass>``, ``#replay<n>``; none for a fresh sample), as the stream keys the record
    (``Group.copy_id``); the group id alone for a sample id of another form. A replayed copy is a
    group of its own: sharing its original's id, it was dropped as stale with an original left over
    from the version before, and a lockstep run with replay waited for ever."""
    trajectory = sample.trajectory
    if sample.replayed and sample.sample_id.startswith(trajectory.trajectory_id):
        suffix = sample.sample_id[len(trajectory.trajectory_id) :]
        if COPY_SUFFIX.fullmatch(suffix):
            return trajectory.group_id + suffix
    return trajectory.group_id


class BatchAssembler:
    """Cuts the sample stream into batches of whole groups, strictly in offset order.

    A dead-lettered member (``fail``) counts towards its group like a sample, so the group
    completes; the batch holds only the samples, with every message it covers.
    """

    def __init__(self, batch_samples: int, group_size: int, remember: int = 200_000) -> None:
        self.batch_samples = batch_samples
        self.group_size = group_size
        self.buffer: list[tuple[TrainSample | None, Message, str, int]] = []
        """In offset order: the sample (``None``: dead-lettered), its message, its group id and size."""
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember
        self.duplicates = 0
        self.stale: list[tuple[TrainSample | None, Message]] = []
        """The stale groups' records of the last batch's prefix (``take``)."""
        self.skipped: list[tuple[TrainSample | None, Message]] = []
        """The records of the replayed copies beyond ``replay_cap`` in the last batch's prefix (``take``)."""
        self._skipped_copies: OrderedDict[str, None] = OrderedDict()
        """Copies skipped so far (the newest ``remember``): their records after a batch's prefix are skipped too."""

    def remember(self, sample_id: str) -> bool:
        """Note ``sample_id`` as taken; False when it was already (a duplicate)."""
        return note_newest(self._seen, sample_id, self._remember)

    def add(self, sample: TrainSample, message: Message) -> None:
        if not self.remember(sample.sample_id):
            self.duplicates += 1
            return
        self.buffer.append((sample, message, copy_id(sample), sample.trajectory.group_size))

    def admit(
        self, message: Message, codec: Codec, problem_of: Callable[[TrainSample], str | None], reject: Reject
    ) -> None:
        """Add the sample of ``message``, or ``reject`` it with the reason (undecodable; ``problem_of``
        names a problem or raises) and count it towards its group: the record key's, since a sample's own
        group id may be what is wrong with it. A rejected sample's copy (a redelivery) is counted once;
        one whose sample id is itself invalid has no identity to be a copy of, and is counted each time."""
        group_id = message.key.decode("utf-8", "replace") if message.key else None
        try:
            sample = codec.decode(message.value, expect=TrainSample)
        except AstraFlowError as exc:
            reject(message, f"undecodable sample: {exc}", exc)
            self.fail(message, group_id)
            return
        try:
            problem, error = problem_of(sample), None
        except Exception as exc:  # a check that raises rejects this sample, never the trainer
            problem, error = error_reason(exc), exc
        if problem is None:
            self.add(sample, message)
            return
        if id_problem(sample.sample_id) is None and not self.remember(sample.sample_id):  # a copy
            self.duplicates += 1
            return
        reject(message, f"invalid sample {clipped(sample.sample_id)}: {problem}", error)
        self.fail(message, group_id if group_id is not None else copy_id(sample))

    def fail(self, message: Message, group_id: str | None) -> None:
        """Count a dead-lettered sample of ``group_id`` (the record key; ``None``: its own group of one)."""
        if group_id is None:
            self.buffer.append((None, message, f"{message.partition}@{message.offset}", 1))
        else:
            self.buffer.append((None, message, group_id, self.group_size))

    def held(self, oldest_version: int | None = None) -> tuple[int, int]:
        """(samples that would count towards the next batch, samples of groups stale at ``oldest_version``)
        in the buffer: what a trainer waiting for a batch says it holds. The later members of a replayed
        copy that ``take`` skipped count as neither: they are consumed untrained."""
        stale_groups = self._stale_groups(oldest_version)
        stale = sum(1 for _, _, gid, _ in self.buffer if gid in stale_groups)
        skipped = sum(1 for _, _, gid, _ in self.buffer if gid in self._skipped_copies and gid not in stale_groups)
        return len(self.buffer) - stale - skipped, stale

    def _stale_groups(self, oldest_version: int | None) -> set[str]:
        """Ids of the buffered groups with a fresh (not replayed) sample generated before ``oldest_version``."""
        if oldest_version is None:
            return set()
        return {
            gid
            for sample, _, gid, _ in self.buffer
            if sample is not None and not sample.replayed and sample.trajectory.min_version < oldest_version
        }

    def take(
        self, oldest_version: int | None = None, replay_cap: int | None = None
    ) -> list[tuple[TrainSample | None, Message]] | None:
        """The next batch - (sample, or ``None`` for a dead-lettered one; its message) in offset order -
        when the buffer's prefix holds enough whole groups.

        With ``oldest_version``, a group with a fresh (not replayed) sample generated before it is
        stale: it takes no place in the batch, and the records of it in the batch's prefix are in
        ``stale`` after the call, (sample, message) each, consumed with the batch. With
        ``replay_cap`` (lockstep with replay: ``StreamConfig.lockstep_replays``) the batch takes at
        most that many replayed copies, in offset order; the records of further ones are in
        ``skipped``, consumed with the batch untrained (copies: their originals were trained)."""
        stale_groups = self._stale_groups(oldest_version)
        self.stale, self.skipped = [], []
        remaining: dict[str, int] = {}
        copies: set[str] = set()
        fresh = 0
        for index, (_, _, gid, size) in enumerate(self.buffer):
            if gid in stale_groups or gid in self._skipped_copies:
                continue
            if replay_cap is not None and gid not in copies and REPLAY_COPY.search(gid):
                if len(copies) >= replay_cap:
                    note_newest(self._skipped_copies, gid, self._remember)
                    continue
                copies.add(gid)
            fresh += 1
            remaining[gid] = remaining.get(gid, size) - 1
            if remaining[gid] <= 0:
                del remaining[gid]
            if fresh >= self.batch_samples and not remaining:
                prefix, self.buffer = self.buffer[: index + 1], self.buffer[index + 1 :]
                self.stale = [(sample, message) for sample, message, gid, _ in prefix if gid in stale_groups]
                self.skipped = [(s, m) for s, m, gid, _ in prefix if gid in self._skipped_copies]
                return [
                    (sample, message)
                    for sample, message, gid, _ in prefix
                    if gid not in stale_groups and gid not in self._skipped_copies
                ]
        return None


def recall_trained(
    log: Log,
    codec: Codec,
    offsets: dict[int, int],
    partitions: list[TopicPartition],
    assembler: BatchAssembler,
    window: int,
) -> None:
    """After a restart, re-read the ids of the last ``window`` samples below ``offsets`` (the
    checkpointed ones, by partition) into ``assembler``'s memory.

    A stream processor that crashed between emitting a group and committing its input emits the
    group again; the copy lands right after the original. Remembering the ids trained just before
    the checkpoint lets the dedup in ``BatchAssembler`` drop such a copy across trainer restarts too.
    """
    for tp in partitions:
        end = offsets.get(tp.partition, 0)
        if end == 0:
            continue
        reader = log.consumer()  # no group: reads without touching the trainer's offsets
        try:
            reader.assign([tp])
            reader.seek(tp, max(0, end - window))
            position = max(0, end - window)
            while position < end:
                messages = reader.poll(max_records=1024, timeout=1.0)
                if not messages:
                    break
                for message in messages:
                    position = message.offset + 1
                    if message.offset < end:
                        try:
                            assembler.remember(codec.decode(message.value, expect=TrainSample).sample_id)
                        except AstraFlowError:
                            pass  # dead-lettered when it was first read
        finally:
            reader.close()


def policy_examples(batch: list[TrainSample]) -> list:
    """The batch as the learner takes it (``training.step.PolicyExample``): each sample's tokens, behaviour
    log-probs, loss mask, and its per-token advantages where the stream made them, else its advantage."""
    from astraflow.training.step import PolicyExample  # torch: only the trainer process needs it

    return [
        PolicyExample(
            s.trajectory.prompt_ids,
            s.trajectory.response_ids,
            s.trajectory.behaviour_logprobs,
            s.trajectory.loss_mask,
            s.token_advantages if len(s.token_advantages) else s.advantage,
        )
        for s in batch
    ]
