"""Publish a weight version as bounded-size chunks followed by a manifest.

Steps of one publish (what makes a version atomic for readers):

1. The state dict is serialised once with safetensors (float32, CPU) into one payload.
2. The payload is cut into chunks of at most ``chunk_bytes`` and each is sent to the chunk
   partition of ``{run}.weights.{policy}``, then flushed (durable before anything refers to it).
3. The manifest (version, base version, tensor table, total size, sha256 of the payload) is sent
   to the manifest partition and flushed. A reader applies a version only after it holds the
   manifest and every chunk and the checksum matches, so a crash mid-publish leaves no version.
"""

from __future__ import annotations

import hashlib
import json

from astraflow.context import now_ms
from astraflow.log import Producer
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import TensorSpec, WeightChunk
from astraflow.topics import MiB, WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION


def serialise_state(state: dict) -> tuple[bytes, list[TensorSpec]]:
    """safetensors bytes of a state dict plus a table of its tensors."""
    from safetensors.torch import save

    tensors, seen = {}, set()
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu").contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if pointer in seen else tensor  # tied weights: safetensors wants distinct storage
        seen.add(pointer)
    payload = save(tensors)
    header_len = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + header_len])
    specs = [
        TensorSpec(name, meta["dtype"], list(meta["shape"]), 8 + header_len + meta["data_offsets"][0], meta["data_offsets"][1] - meta["data_offsets"][0])
        for name, meta in header.items()
        if name != "__metadata__"
    ]
    return payload, specs


def deserialise_state(payload: bytes) -> dict:
    from safetensors.torch import load

    return load(payload)


class WeightPublisher:
    """Sends full weight versions of one policy to its weights topic."""

    def __init__(self, producer: Producer, codec: Codec, topic: str, policy: str, chunk_bytes: int = 4 * MiB) -> None:
        self.producer = producer
        self.codec = codec
        self.topic = topic
        self.policy = policy
        self.chunk_bytes = chunk_bytes

    def publish(self, state: dict, version: int) -> WeightChunk:
        payload, specs = serialise_state(state)
        digest = hashlib.sha256(payload).hexdigest()
        pieces = [payload[i : i + self.chunk_bytes] for i in range(0, len(payload), self.chunk_bytes)] or [b""]
        key = f"{self.policy}:{version}".encode()
        for index, piece in enumerate(pieces):
            chunk = WeightChunk(self.policy, version, -1, "full", "chunk", index, len(pieces), len(payload), digest, data=piece, created_ms=now_ms())
            self.producer.send(self.topic, self.codec.encode(chunk), key=key, partition=WEIGHTS_CHUNK_PARTITION)
        self.producer.flush()
        manifest = WeightChunk(self.policy, version, -1, "full", "manifest", -1, len(pieces), len(payload), digest, tensors=specs, created_ms=now_ms())
        self.producer.send(self.topic, self.codec.encode(manifest), key=key, partition=WEIGHTS_MANIFEST_PARTITION)
        self.producer.flush()
        return manifest
