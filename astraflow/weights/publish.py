"""Publish a weight version, full or as a sparse delta, as bounded-size chunks followed by a manifest.

Steps of one publish (what makes a version atomic and exact for readers):

1. The state dict is copied to the CPU with floating tensors in the transfer dtype (bf16 by
   default, ``weights.transfer_dtype``). That copy is kept as the base of the next delta.
2. The payload is a delta against the previously published version (``delta.py``: only the
   elements whose bits changed) unless this is the first publish of this publisher, ``full`` was
   asked for, ``weights.encoding`` is ``full``, or ``full_sync_interval`` versions passed since
   the last full version; then every tensor is written whole (still in the transfer dtype).
3. The payload is cut into chunks of at most ``chunk_bytes``, each sent to the chunk partition of
   ``{run}.weights.{policy}``, then flushed (durable before anything refers to it).
4. The manifest (version, base version and base sha256, tensor table, total size, sha256 of the
   payload) is sent to the manifest partition and flushed. A reader applies a version only after
   it holds the manifest and every chunk, the checksum matches and, for a delta, it holds exactly
   the base (version and sha256), so a crash mid-publish leaves no version and no wrong weights.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Mapping

from astraflow.config import WeightsConfig
from astraflow.context import now_ms
from astraflow.log import Producer
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION


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
    """Checksum, chunk, send and flush (steps 3-4)."""


class WeightPublisher:
    """Sends weight versions of one policy to its weights topic, as deltas with periodic full ones."""

    def __init__(self, producer: Producer, codec: Codec, topic: str, policy: str, config: WeightsConfig | None = None) -> None:
        self.producer = producer
        self.codec = codec
        self.topic = topic
        self.policy = policy
        self.config = config or WeightsConfig()
        self.last_stats: PublishStats | None = None
        self._previous: PublishedVersion | None = None
        self._last_full = -1

    def publish(self, state: Mapping, version: int, full: bool = False) -> WeightChunk:
        """Send ``state`` as ``version``; ``full`` forces a complete version. Returns the manifest."""
        from astraflow.weights.payload import build_payload, to_transfer

        started = time.perf_counter()
        transfer = to_transfer(state, self.config.transfer_dtype)
        base = None if full else self._delta_base(version)
        payload = build_payload(transfer, base.state if base else None)
        encoded = time.perf_counter()
        digest = hashlib.sha256(payload.buffer).hexdigest()
        encoding = "delta" if base else "full"
        base_version, base_sha256 = (base.version, base.sha256) if base else (-1, "")
        total, size = len(payload.buffer), self.config.chunk_bytes
        view = memoryview(payload.buffer)
        pieces = [bytes(view[i : i + size]) for i in range(0, total, size)] or [b""]
        key = f"{self.policy}:{version}".encode()
        for index, piece in enumerate(pieces):
            chunk = WeightChunk(self.policy, version, base_version, encoding, "chunk", index, len(pieces), total, digest,
                                data=piece, created_ms=now_ms(), base_sha256=base_sha256)
            self.producer.send(self.topic, self.codec.encode(chunk), key=key, partition=WEIGHTS_CHUNK_PARTITION)
        self.producer.flush()
        manifest = WeightChunk(self.policy, version, base_version, encoding, "manifest", -1, len(pieces), total, digest,
                               tensors=payload.specs, created_ms=now_ms(), base_sha256=base_sha256)
        self.producer.send(self.topic, self.codec.encode(manifest), key=key, partition=WEIGHTS_MANIFEST_PARTITION)
        self.producer.flush()
        self._previous = PublishedVersion(version, digest, transfer)
        if base is None:
            self._last_full = version
        self.last_stats = PublishStats(encoding, total, payload.elements, payload.changed, payload.changes,
                                       encoded - started, time.perf_counter() - encoded)
        return manifest

    def _delta_base(self, version: int) -> PublishedVersion | None:
        previous = self._previous
        if self.config.encoding == "full" or previous is None or version <= previous.version:
            return None
        if version - self._last_full >= self.config.full_sync_interval:
            return None
        return previous
