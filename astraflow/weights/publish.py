"""Publish a weight version, full or as a sparse delta, as bounded-size chunks followed by a manifest.

Steps of one publish (what makes a version atomic and exact for readers):

1. The state dict is copied to the CPU with floating tensors in the transfer dtype (bf16 by
   default, ``weights.transfer_dtype``). That copy is kept as the base of the next delta; the
   copy before it, no longer needed, is overwritten by the next publish instead of allocated.
2. The payload is a delta against the previously published version (``delta.py``: only the
   elements whose bits changed) unless this is the first publish of this publisher, ``full`` was
   asked for, ``weights.encoding`` is ``full``, or ``full_sync_interval`` versions passed since
   the last full version; then every tensor is written whole (still in the transfer dtype).
3. The payload is cut into chunks of at most ``chunk_bytes``. ``transport: inline`` sends each to
   the chunk partition of ``{run}.weights.{policy}``, then flushes (durable before anything refers
   to it); ``transport: store`` writes them to the store (``store.py``) instead. With
   ``weights.encode_workers`` (one per core by default, ``transport: inline``) steps 1-3 overlap:
   tensors are encoded on several threads and each chunk is sent as soon as it fills (``streamed.py``).
4. The manifest (version, base version and base sha256, tensor table, total size, sha256 of the
   payload, with a store the chunks' URI, and the chunk partition's end before step 3, from which
   a new reader that starts at this version reads its chunks) is sent to the manifest partition
   and flushed; or, given a ``transaction``, sent in it, to become visible when the caller commits
   (the trainer commits it with its ledger entry and offsets). A reader applies a version only
   after it holds the manifest and every chunk, the checksum matches and, for a delta, it holds
   exactly the base (version and sha256), so a crash mid-publish leaves no version and no wrong
   weights. With ``weights.signing_key`` the manifest is signed (``signing.py``), and readers that
   hold ``weights.verify_key`` take in only signed versions.
5. With ``keep_versions`` (8 by default), versions no longer kept are deleted from the topic and
   the store (``retention.py``) once the new version is visible: at once without a transaction,
   else when the caller says its transaction committed (``committed``).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from typing import Mapping

from astraflow.config import WeightsConfig
from astraflow.core.crashpoints import crash_point
from astraflow.core.errors import ConfigError, WeightsError
from astraflow.log import Log, Producer, TransactionalProducer
from astraflow.runtime.context import now_ms
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.retention import KeptVersion, VersionRetention
from astraflow.weights.signing import ManifestSigner, ManifestVerifier
from astraflow.weights.store import ChunkStore, open_store


@dataclass(frozen=True)
class PublishedVersion:
    """What the publisher keeps of the version it sent last: the base of the next delta."""

    version: int
    sha256: str
    state: dict
    """Transfer-dtype CPU copy of the weights, exactly as readers reconstruct them."""


@dataclass(frozen=True)
class PublishStats:
    """Size of one published version, for metrics and benchmarks."""

    encoding: str
    total_bytes: int
    elements: int
    changed: int
    changes: list[tuple[str, int, int]]
    """(name, elements, changed elements) per stored tensor."""
    encode_seconds: float
    """Copy to the transfer dtype and encode (steps 1-2)."""
    send_seconds: float
    """Checksum, chunk, send or store, and flush (steps 3-4)."""


class WeightPublisher:
    """Sends weight versions of one policy to its weights topic, as deltas with periodic full ones.

    ``log`` is needed for ``weights.keep_versions`` (to delete old records from the topic), and gives
    each manifest its ``chunk_offset``; without it, ``keep_versions`` must be ``None``.
    """

    def __init__(
        self,
        producer: Producer,
        codec: Codec,
        topic: str,
        policy: str,
        config: WeightsConfig | None = None,
        log: Log | None = None,
    ) -> None:
        self.producer = producer
        self.codec = codec
        self.topic = topic
        self.policy = policy
        self.config = config or WeightsConfig()
        self.last_stats: PublishStats | None = None
        self._log = log
        self._store = open_store(self.config.store) if self.config.transport == "store" else None
        self._signer = signer_for(self.config)
        self._retention = None
        if self.config.keep_versions is not None:
            if log is None:
                raise WeightsError("weights.keep_versions: the publisher needs the log to delete old versions from")
            self._retention = VersionRetention(self.config.keep_versions, log, topic, self._store)
        self._previous: PublishedVersion | None = None
        self._visible: KeptVersion | None = None
        """The version whose retention waits for its transaction's commit (``committed``)."""
        self._spare: dict | None = None
        self._last_full = -1

    def last_state(self) -> tuple[int, dict] | None:
        """(version, weights in the transfer dtype) of the version sent last, or ``None`` before the first."""
        return None if self._previous is None else (self._previous.version, self._previous.state)

    def publish(
        self, state: Mapping, version: int, full: bool = False, transaction: TransactionalProducer | None = None
    ) -> WeightChunk:
        """Send ``state`` as ``version``; ``full`` forces a complete version; with ``transaction``
        (open) the manifest goes into it (step 4). Returns the manifest."""
        started = time.perf_counter()
        base = None if full else self._delta_base(version)
        base_version, base_sha256 = (base.version, base.sha256) if base else (-1, "")
        start = self._log.end_offsets(self.topic) if self._log is not None else {}  # where its records will start
        outline = WeightChunk(
            self.policy,
            version,
            base_version,
            "delta" if base else "full",
            "manifest",
            -1,
            0,
            0,
            "",
            base_sha256=base_sha256,
            chunk_offset=start.get(WEIGHTS_CHUNK_PARTITION, -1),
        )
        workers = self.config.encode_workers if self.config.encode_workers is not None else os.cpu_count() or 1
        if workers and self._store is None:
            from astraflow.weights.streamed import stream_chunks

            sent = stream_chunks(
                self.producer,
                self.codec,
                self.topic,
                outline,
                state,
                self.config.transfer_dtype,
                base.state if base else None,
                self._spare,
                self.config.chunk_bytes,
                workers,
                self.config.entropy_coding,
                self.config.compiled_encode,
            )
            transfer, changes = sent.transfer, sent.changes
            encoded = started + sent.encode_seconds
            flush_chunks(self.producer, version)
            outline = replace(
                outline,
                num_chunks=sent.num_chunks,
                total_bytes=sent.total_bytes,
                sha256=sent.sha256,
                tensors=sent.specs,
                publish_id=sent.publish_id,
                created_ms=now_ms(),
            )
            manifest = send_manifest(self.producer, self.codec, self.topic, outline, transaction, self._signer)
        else:
            from astraflow.weights.payload import build_payload, to_transfer

            transfer = to_transfer(state, self.config.transfer_dtype, reuse=self._spare)
            payload = build_payload(transfer, base.state if base else None, self.config.entropy_coding)
            changes = payload.changes
            encoded = time.perf_counter()
            manifest = send_version(
                self.producer,
                self.codec,
                self.topic,
                replace(outline, tensors=payload.specs),
                payload.buffer,
                self.config.chunk_bytes,
                self._store,
                transaction,
                self._signer,
            )
        self._spare = None
        if self._previous is not None and self._previous.state is not transfer:
            self._spare = self._previous.state  # nobody reads the old base any more: the next copy goes there
        self._previous = PublishedVersion(version, manifest.sha256, transfer)
        if base is None:
            self._last_full = version
        if self._retention is not None:
            self._visible = KeptVersion(version, base is None, start, manifest.store_uri)
            if transaction is None:  # flushed: visible now
                self.committed()
        self.last_stats = PublishStats(
            manifest.encoding,
            manifest.total_bytes,
            sum(n for _, n, _ in changes),
            sum(k for _, _, k in changes),
            changes,
            encoded - started,
            time.perf_counter() - encoded,
        )
        return manifest

    def committed(self) -> None:
        """The transaction that carried the last manifest committed: apply retention
        (``weights.keep_versions``) to what that version made unneeded. Never before: a fenced
        trainer's publish never commits, so it deletes nothing of the versions a newer one published."""
        if self._retention is not None and self._visible is not None:
            self._retention.published(self._visible)
        self._visible = None

    @property
    def published(self) -> PublishedVersion | None:
        """The version sent last, as readers reconstruct it (valid until the next publish but one);
        ``None`` before any."""
        return self._previous

    def _delta_base(self, version: int) -> PublishedVersion | None:
        previous = self._previous
        if self.config.encoding == "full" or previous is None or version <= previous.version:
            return None
        if version - self._last_full >= self.config.full_sync_interval:
            return None
        return previous


def signer_for(config: WeightsConfig) -> ManifestSigner | None:
    """The signer of ``weights.signing_key``, checked against ``weights.verify_key`` (a trainer whose
    key the readers do not hold would publish versions every one of them refuses), or ``None``."""
    if not config.signing_key:
        return None
    signer = ManifestSigner(config.signing_key)
    expected = ManifestVerifier(config.verify_key).fingerprint
    if signer.fingerprint != expected:
        raise ConfigError(
            f"weights.signing_key {config.signing_key} (key {signer.fingerprint}) is not the pair of "
            f"weights.verify_key {config.verify_key} (key {expected}): "
            "every reader would refuse this trainer's versions"
        )
    return signer


def send_version(
    producer: Producer,
    codec: Codec,
    topic: str,
    outline: WeightChunk,
    payload: bytearray,
    chunk_bytes: int,
    store: ChunkStore | None = None,
    transaction: TransactionalProducer | None = None,
    signer: ManifestSigner | None = None,
) -> WeightChunk:
    """Steps 3-4 of a publish: checksum ``payload``, send its chunks (or put them in ``store``), then
    the manifest, each flushed; the manifest into ``transaction`` instead when one is given.
    ``outline`` gives the manifest's policy, version, base, encoding and tensors; sizes, checksum,
    store URI and time are filled in, and with ``signer`` the signature. Returns the manifest as sent."""
    digest = hashlib.sha256(payload).hexdigest()
    total = len(payload)
    view = memoryview(payload)
    pieces = [view[i : i + chunk_bytes] for i in range(0, total, chunk_bytes)] or [view]
    key = f"{outline.policy}:{outline.version}".encode()
    uri = None
    if store is not None:
        uri = store.put(topic, outline.version, digest, pieces)
    else:
        for index, piece in enumerate(pieces):
            chunk = replace(
                outline,
                kind="chunk",
                chunk_index=index,
                num_chunks=len(pieces),
                total_bytes=total,
                sha256=digest,
                data=bytes(piece),
                tensors=[],
                created_ms=now_ms(),
            )
            producer.send(topic, codec.encode(chunk), key=key, partition=WEIGHTS_CHUNK_PARTITION)
        flush_chunks(producer, outline.version)
    manifest = replace(
        outline,
        kind="manifest",
        chunk_index=-1,
        num_chunks=len(pieces),
        total_bytes=total,
        sha256=digest,
        store_uri=uri,
        created_ms=now_ms(),
    )
    return send_manifest(producer, codec, topic, manifest, transaction, signer)


def flush_chunks(producer: Producer, version: int) -> None:
    """End of step 3: every chunk sent is durable before a manifest can refer to it."""
    crash_point("publish.flush_chunks", version)
    producer.flush()


def send_manifest(
    producer: Producer,
    codec: Codec,
    topic: str,
    manifest: WeightChunk,
    transaction: TransactionalProducer | None = None,
    signer: ManifestSigner | None = None,
) -> WeightChunk:
    """Step 4 of a publish, once every chunk is flushed: sign ``manifest`` (with ``signer``) and send
    it, flushed, or into ``transaction``. Returns the manifest as sent."""
    key = f"{manifest.policy}:{manifest.version}".encode()
    if signer is not None:
        manifest = signer.sign(manifest, topic)
    if transaction is not None:
        transaction.send(topic, codec.encode(manifest), key=key, partition=WEIGHTS_MANIFEST_PARTITION)
        return manifest
    producer.send(topic, codec.encode(manifest), key=key, partition=WEIGHTS_MANIFEST_PARTITION)
    crash_point("publish.flush_manifest", manifest.version)
    producer.flush()
    return manifest
