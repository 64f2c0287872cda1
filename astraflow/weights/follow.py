"""Follow a policy's weights topic in the background and hand out the newest complete version.

``WeightFollower`` runs one thread with its own consumer (no group: every follower sees every
version). With ``payload=False`` it reads only the manifest partition, which is all that the
feeder and the staleness filter need to know the trainer's version. With ``payload=True`` it also
reads the chunks, assembles a version once its manifest and every chunk are in hand (chunks are
grouped by version *and* sha256, since a restarted trainer may republish a version with other
bytes), verifies the sha256, and keeps it as *pending* until the owner takes it between two generations; a version
with a bad checksum or a malformed payload is logged, counted (``corrupt_versions``) and skipped,
never applied.

Deltas: the follower keeps the state of the version it assembled last (transfer dtype) and applies
a delta only when that is exactly the delta's base (``base_version`` and ``base_sha256``). A
delta whose base it does not hold (it missed a version, rejected a corrupt one, or the trainer
restarted from an older checkpoint) is logged, counted (``skipped_deltas``) and skipped; the
follower keeps its version until the next full one, which the trainer sends at least every
``weights.full_sync_interval`` versions. Handed-out state dicts are never written to afterwards:
a delta builds new tensors for the changed ones and shares the unchanged ones.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass

from astraflow.errors import AstraFlowError, WeightsError
from astraflow.log import Log, TopicPartition
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Held:
    version: int
    sha256: str
    state: dict


def assemble(manifest: WeightChunk, pieces: dict[int, bytes]) -> bytearray:
    """The payload of a version from all its chunks; ``WeightsError`` when sizes or checksum disagree."""
    payload = bytearray(manifest.total_bytes)
    offset = 0
    for index in range(manifest.num_chunks):
        piece = pieces[index]
        if offset + len(piece) > manifest.total_bytes:
            raise WeightsError(f"chunks hold more than the manifest's {manifest.total_bytes} bytes")
        payload[offset : offset + len(piece)] = piece
        offset += len(piece)
    if offset != manifest.total_bytes:
        raise WeightsError(f"chunks hold {offset} bytes, the manifest says {manifest.total_bytes}")
    if hashlib.sha256(payload).hexdigest() != manifest.sha256:
        raise WeightsError("payload failed its sha256 checksum")
    return payload


class WeightFollower:
    """Tracks the newest version on a weights topic; with ``payload`` also its state dict."""

    def __init__(self, log: Log, topic: str, payload: bool, poll_timeout: float = 0.2) -> None:
        self.topic = topic
        self.payload = payload
        self.latest_version = -1
        """Newest version taken in (assembled, or with ``payload=False`` announced)."""
        self.latest_published_ms = 0
        self.newest_version = -1
        """Newest version announced by a manifest, applicable or not."""
        self.taken_published_ms = 0
        """Publish time of the version ``take`` returned last (for publish → applied latency)."""
        self.skipped_deltas = 0
        self.corrupt_versions = 0
        self._codec = Codec()
        self._consumer = log.consumer(group_id=None)
        partitions = [WEIGHTS_MANIFEST_PARTITION] + ([WEIGHTS_CHUNK_PARTITION] if payload else [])
        self._consumer.assign([TopicPartition(topic, p) for p in partitions])
        self._consumer.seek_to_beginning()
        self._manifest_tp = TopicPartition(topic, WEIGHTS_MANIFEST_PARTITION)
        self._catch_up_to = log.end_offsets(topic).get(WEIGHTS_MANIFEST_PARTITION, 0)
        self._newest_rejected = -1
        self._caught_up = threading.Event()
        self._chunks: dict[tuple[int, str], dict[int, bytes]] = defaultdict(dict)
        self._manifests: dict[tuple[int, str], WeightChunk] = {}
        self._pending: tuple[int, dict, int] | None = None
        self._held: _Held | None = None
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._poll_timeout = poll_timeout
        self._thread = threading.Thread(target=self._run, name=f"weights-{topic}", daemon=True)

    def start(self) -> "WeightFollower":
        self._thread.start()
        return self

    def take(self) -> tuple[int, dict] | None:
        """The newest assembled (version, state dict) not taken yet, or ``None``."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return None
            version, state, self.taken_published_ms = pending
            return version, state

    def wait_for(self, version: int, timeout: float) -> bool:
        """Block until a version >= ``version`` is known, or ``timeout`` seconds pass."""
        with self._lock:
            return self._lock.wait_for(lambda: self.latest_version >= version, timeout)

    def wait_caught_up(self, timeout: float) -> bool:
        """Block until every version published before this follower started has been taken in."""
        return self._caught_up.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.poll(max_records=64, timeout=self._poll_timeout):
                try:
                    record = self._codec.decode(message.value, expect=WeightChunk)
                except AstraFlowError as exc:
                    logger.error("skipping an undecodable weights record at %s:%d: %s", message.partition, message.offset, exc)
                    continue
                self._receive(record)
            if not self._caught_up.is_set() and self._consumer.position(self._manifest_tp) >= self._catch_up_to:
                if max(self.latest_version, self._newest_rejected) >= self.newest_version:
                    self._caught_up.set()

    def _receive(self, record: WeightChunk) -> None:
        if record.kind == "manifest":
            self.newest_version = max(self.newest_version, record.version)
        if record.version <= self.latest_version:
            return
        if not self.payload:
            if record.kind == "manifest":
                self._set_latest(record.version, record.created_ms, None)
            return
        key = (record.version, record.sha256)  # a restarted trainer may republish a version with other bytes
        if record.kind == "chunk":
            self._chunks[key][record.chunk_index] = record.data
        else:
            self._manifests[key] = record
        manifest = self._manifests.get(key)
        pieces = self._chunks[key]
        if manifest is None or len(pieces) < manifest.num_chunks or any(i not in pieces for i in range(manifest.num_chunks)):
            return
        for stale in [k for k in self._chunks if k[0] <= record.version]:
            del self._chunks[stale]
        for stale in [k for k in self._manifests if k[0] <= record.version]:
            del self._manifests[stale]
        self._take_in(manifest, pieces)

    def _take_in(self, manifest: WeightChunk, pieces: dict[int, bytes]) -> None:
        """Apply one complete version, or count and log why it is not applied."""
        from astraflow.weights.payload import read_payload

        held = self._held
        base = None
        if manifest.encoding == "delta":
            if held is None or (held.version, held.sha256) != (manifest.base_version, manifest.base_sha256):
                self.skipped_deltas += 1
                self._newest_rejected = max(self._newest_rejected, manifest.version)
                logger.warning("weights version %d of %s is a delta on version %d, but this reader holds %s; waiting for the next full version",
                               manifest.version, self.topic, manifest.base_version, held.version if held else "none")
                return
            base = held.state
        try:
            if manifest.encoding not in ("full", "delta"):
                raise WeightsError(f"unknown version encoding {manifest.encoding!r}")
            state = read_payload(assemble(manifest, pieces), manifest.tensors, base)
        except WeightsError as exc:
            self.corrupt_versions += 1
            self._newest_rejected = max(self._newest_rejected, manifest.version)
            logger.error("weights version %d of %s not applied: %s", manifest.version, self.topic, exc)
            return
        self._held = _Held(manifest.version, manifest.sha256, state)
        self._set_latest(manifest.version, manifest.created_ms, state)

    def _set_latest(self, version: int, published_ms: int, state: dict | None) -> None:
        with self._lock:
            self.latest_version = version
            self.latest_published_ms = published_ms
            if state is not None:
                self._pending = (version, state, published_ms)
            self._lock.notify_all()
