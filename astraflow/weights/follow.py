"""Follow a policy's weights topic in the background and hand out the newest complete version.

``WeightFollower`` runs one thread with its own consumer (no group: every follower sees every
version). With ``payload=False`` it reads only the manifest partition, which is all that the
feeder and the staleness filter need to know the trainer's version. With ``payload=True`` it also
reads the chunks, assembles a version once its manifest and every chunk are in hand, verifies the
sha256, and keeps it as *pending* until the owner takes it between two generations; a version
with a bad checksum is logged and skipped, never applied.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import defaultdict

from astraflow.errors import AstraFlowError
from astraflow.log import Log, TopicPartition
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION
from astraflow.weights.publish import deserialise_state

logger = logging.getLogger(__name__)


class WeightFollower:
    """Tracks the newest version on a weights topic; with ``payload`` also its state dict."""

    def __init__(self, log: Log, topic: str, payload: bool, poll_timeout: float = 0.2) -> None:
        self.topic = topic
        self.payload = payload
        self.latest_version = -1
        self.latest_published_ms = 0
        self._codec = Codec()
        self._consumer = log.consumer(group_id=None)
        partitions = [WEIGHTS_MANIFEST_PARTITION] + ([WEIGHTS_CHUNK_PARTITION] if payload else [])
        self._consumer.assign([TopicPartition(topic, p) for p in partitions])
        self._consumer.seek_to_beginning()
        self._manifest_tp = TopicPartition(topic, WEIGHTS_MANIFEST_PARTITION)
        self._catch_up_to = log.end_offsets(topic).get(WEIGHTS_MANIFEST_PARTITION, 0)
        self._newest_manifest = -1
        self._newest_rejected = -1
        self._caught_up = threading.Event()
        self._chunks: dict[int, dict[int, bytes]] = defaultdict(dict)
        self._manifests: dict[int, WeightChunk] = {}
        self._pending: tuple[int, dict] | None = None
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
            return pending

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
                if max(self.latest_version, self._newest_rejected) >= self._newest_manifest:
                    self._caught_up.set()

    def _receive(self, record: WeightChunk) -> None:
        if record.kind == "manifest":
            self._newest_manifest = max(self._newest_manifest, record.version)
        if record.version <= self.latest_version:
            return
        if record.kind == "chunk":
            self._chunks[record.version][record.chunk_index] = record.data
        else:
            self._manifests[record.version] = record
        if not self.payload and record.kind == "manifest":
            self._set_latest(record.version, record.created_ms, None)
            return
        manifest = self._manifests.get(record.version)
        if manifest is None or len(self._chunks[record.version]) < manifest.num_chunks:
            return
        pieces = self._chunks.pop(record.version)
        self._manifests.pop(record.version)
        payload = b"".join(pieces[i] for i in range(manifest.num_chunks))
        if hashlib.sha256(payload).hexdigest() != manifest.sha256:
            logger.error("weights version %d of %s failed its checksum; not applied", record.version, self.topic)
            self._newest_rejected = max(self._newest_rejected, record.version)
            return
        self._set_latest(record.version, manifest.created_ms, deserialise_state(payload))
        for stale in [v for v in self._chunks if v <= record.version]:
            del self._chunks[stale]

    def _set_latest(self, version: int, published_ms: int, state: dict | None) -> None:
        with self._lock:
            self.latest_version = version
            self.latest_published_ms = published_ms
            if state is not None:
                self._pending = (version, state)
            self._lock.notify_all()
