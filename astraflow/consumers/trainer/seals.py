"""The trainer's side of sealed checkpoints (``weights/seal.py``): it seals each checkpoint once the
checkpoint's version is published, and checks the seal of the one it resumes from.

A checkpoint's weights are those of the version published last when it is written at a stop, and of
the version about to be published when it is due (step 3 of ``component.py``): either way the seal is
made from the publisher's copy of that version in the transfer dtype (``WeightPublisher.last_state``),
exactly what readers load, and written into the checkpoint directory before the version's
transaction commits, so the ledger never names an unsealed checkpoint (a crash in between leaves a
checkpoint of an uncommitted version, which no restart resumes from). Without ``weights.signing_key``
nothing is sealed; without ``weights.verify_key`` nothing is checked.
"""

from __future__ import annotations

import os
from pathlib import Path

from astraflow.config import RunConfig
from astraflow.core.crashpoints import crash_point
from astraflow.training.checkpoint import version_dir
from astraflow.weights.publish import WeightPublisher, signer_for
from astraflow.weights.seal import SEAL_FILE, check_seal, make_seal, state_digest
from astraflow.weights.signing import ManifestVerifier


class CheckpointSeals:
    """Seals and checks the checkpoints of one policy's trainer under ``directory``."""

    def __init__(self, config: RunConfig, topic: str, policy: str, directory: Path) -> None:
        self.topic = topic
        self.policy = policy
        self.directory = directory
        self.dtype = config.weights.transfer_dtype
        self.signer = signer_for(config.weights)
        key = config.weights.verify_key
        self.verifier = ManifestVerifier(key) if key else None

    def seal(self, version: int, publisher: WeightPublisher) -> None:
        """Seal the checkpoint of ``version`` with the weights ``publisher`` sent last (of that version)."""
        published = publisher.last_state()
        if self.signer is None or published is None or published[0] != version:
            return
        data = make_seal(self.signer, self.topic, self.policy, version, state_digest(published[1], self.dtype))
        directory = version_dir(self.directory, version)
        tmp = directory / f"{SEAL_FILE}.tmp"
        with tmp.open("wb") as handle:
            handle.write(data)
            crash_point("seal.flush", version)
            handle.flush()
            crash_point("seal.fsync_file", version)
            os.fsync(handle.fileno())
        crash_point("seal.rename", version)
        os.rename(tmp, directory / SEAL_FILE)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            crash_point("seal.fsync_directory", version)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def check(self, version: int, publisher: WeightPublisher) -> None:
        """Refuse (``WeightsError``) the checkpoint of ``version`` resumed from unless its seal holds for
        the weights ``publisher`` has just sent (the restored ones)."""
        published = publisher.last_state()
        if self.verifier is None or published is None:
            return
        digest = state_digest(published[1], self.dtype)
        check_seal(version_dir(self.directory, version), version, digest, self.verifier, self.topic)
