"""The trainer's side of ``{run}.ledger.{policy}``: what it reads at start, and the entry it commits.

Each version the trainer publishes has one ``LedgerEntry``, committed in the transaction that
makes the version's manifest visible and commits the trainer's offsets (``component.py``, steps
4-6). So the ledger names exactly the versions readers can see, and at a start the trainer reads
from it:

1. its **epoch**: one more than the highest epoch in the ledger (1 for the first trainer);
2. which **checkpoints are valid**: one whose (epoch, version) has an entry. A checkpoint is written
   before its version commits, so a crash or a fencing in between leaves a checkpoint the log never
   saw; the trainer restores the newest valid one instead;
3. the **next version id**: the highest version in the ledger. When it is above the restored
   checkpoint's version - the trainer published versions after its last valid checkpoint, then
   died - the restored weights are published as the version after it, so no version id ever
   names two different weights, and the steps since the checkpoint are trained again into new
   versions. The entries of the versions lost that way stay in the ledger; ``astraflow audit``
   follows each entry's parent to tell the lineage that goes on from the lineage that was left.

The ledger is read by assignment, from its start, once; it holds one small record per version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from astraflow.core.errors import AstraFlowError
from astraflow.log import Log
from astraflow.runtime.attach import read_snapshot
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import LedgerEntry, OffsetRange
from astraflow.training.checkpoint import TrainerState


@dataclass
class TrainerLedger:
    """What a starting trainer needs of its policy's ledger (see the module docstring)."""

    last_epoch: int = 0
    last_version: int | None = None
    """The highest version of any entry; ``None`` for an empty ledger."""
    last_offsets: dict[str, int] = field(default_factory=dict)
    """The samples offsets after the entry of ``last_version`` (the newest version published)."""
    payloads: dict[tuple[int, int], str] = field(default_factory=dict)
    """(epoch, version) of every entry → the sha256 of the version's published payload (a restore is
    checked against it)."""

    @classmethod
    def read(cls, log: Log, codec: Codec, topic: str) -> "TrainerLedger":
        ledger = cls()
        for message in read_snapshot(log, topic):
            try:
                entry = codec.decode(message.value, expect=LedgerEntry)
            except AstraFlowError as exc:
                raise AstraFlowError(
                    f"ledger {topic!r} offset {message.offset} does not decode ({exc}); only the trainer writes"
                    " this topic, so it is not skipped: a trainer cannot tell its valid checkpoints without it"
                ) from exc
            ledger.note(entry)
        return ledger

    def note(self, entry: LedgerEntry) -> None:
        self.payloads[(entry.epoch, entry.version)] = entry.payload_sha256
        self.last_epoch = max(self.last_epoch, entry.epoch)
        if self.last_version is None or entry.version >= self.last_version:
            self.last_version, self.last_offsets = entry.version, dict(entry.offsets)

    @property
    def next_epoch(self) -> int:
        return self.last_epoch + 1

    def names(self, state: TrainerState) -> bool:
        """Whether the checkpoint of ``state`` is one of a committed version (step 2). Before the
        ledger's first entry every checkpoint is taken (a run from before the ledger existed)."""
        return self.last_version is None or (state.epoch, state.version) in self.payloads

    def start_version(self, restored_version: int) -> int:
        """The version id under which a trainer restored at ``restored_version`` publishes (step 3)."""
        if self.last_version is None or self.last_version <= restored_version:
            return restored_version
        return self.last_version + 1


def consumed_ranges(before: dict[int, int], after: dict[int, int]) -> list[OffsetRange]:
    """The samples a step consumed, per partition: from the offsets before it to those after it."""
    return [
        OffsetRange(partition, before.get(partition, 0), end)
        for partition, end in sorted(after.items())
        if end > before.get(partition, 0)
    ]
