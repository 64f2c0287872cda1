"""Claim check for weight payloads (``weights.transport: store``): chunks in a store, manifests on the log.

A large model's versions need not pass through the log: the trainer writes a version's chunks to a
store that every reader can reach, and the weights topic carries only the manifest, whose
``store_uri`` names where the chunks are. Readers fetch them, check the manifest's sha256 and
assemble; the log keeps its order, audit trail and replay, the store carries the bytes.

``FileChunkStore`` (a directory, or a ``file://`` URI: local disk or a shared file system) is the
one backend; an object store is one more ``ChunkStore``. Its layout::

    {root}/{topic}/v{version:012d}-{sha256[:16]}/{index:06d}.chunk

Steps of one ``put`` (what makes a version's chunks atomic for readers):

1. every chunk is written into a temporary sibling directory (``.tmp-...``, never read);
2. the directory is renamed to its final name, so it appears whole or not at all;
3. only then does the publisher send the manifest naming it.

No fsync: after a power cut, a manifest may name chunks that were lost; readers then find them
missing or failing the checksum, and wait for the next full version, as for any unreadable one.
Retention (``weights.keep_versions``) deletes the directories of versions no longer kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from astraflow.core.errors import WeightsError
from astraflow.schemas.records import WeightChunk

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"v\d{12}-[0-9a-f]{1,16}")


class ChunkStore(ABC):
    """Where the chunks of weight versions go with ``weights.transport: store``."""

    @abstractmethod
    def put(self, topic: str, version: int, sha256: str, chunks: Sequence[memoryview]) -> str:
        """Store one version's chunks atomically; returns the URI its manifest carries."""

    @abstractmethod
    def delete(self, uris: Collection[str]) -> None:
        """Delete stored versions (already gone ones are fine)."""

    @abstractmethod
    def sweep(self, topic: str, keep: Collection[str]) -> None:
        """Delete every stored version of ``topic`` except ``keep`` (versions of an earlier trainer run included)."""


class FileChunkStore(ChunkStore):
    """Chunks as files under a root directory (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def put(self, topic: str, version: int, sha256: str, chunks: Sequence[memoryview]) -> str:
        final = self.root / topic / f"v{version:012d}-{sha256[:16]}"
        staging = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            staging.mkdir(parents=True)
            for index, chunk in enumerate(chunks):
                with open(staging / f"{index:06d}.chunk", "wb") as out:
                    out.write(chunk)
            if final.exists():  # the same version and bytes published again (a restarted trainer)
                shutil.rmtree(final)
            os.replace(staging, final)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise WeightsError(f"storing version {version} of {topic} in {final.parent} failed: {exc}") from exc
        return final.as_uri()

    def delete(self, uris: Collection[str]) -> None:
        for uri in uris:
            shutil.rmtree(_local_path(uri), ignore_errors=True)

    def sweep(self, topic: str, keep: Collection[str]) -> None:
        kept = {_local_path(uri) for uri in keep}
        folder = self.root / topic
        if not folder.is_dir():
            return
        for entry in folder.iterdir():
            if _VERSION_DIR.fullmatch(entry.name) and entry not in kept:
                shutil.rmtree(entry, ignore_errors=True)
                logger.info("deleted stored weights %s (not among the versions kept)", entry)


def open_store(location: str) -> ChunkStore:
    """The store at ``weights.store``: a directory path or a ``file://`` URI."""
    return FileChunkStore(_local_path(location) if location.startswith("file://") else Path(location))


def read_stored(uri: str, num_chunks: int, total_bytes: int) -> bytearray:
    """The payload of a stored version: its ``num_chunks`` chunks joined, ``total_bytes`` long.

    ``WeightsError`` when a chunk is missing or the sizes disagree (the caller checks the sha256).
    """
    if not uri.startswith("file://"):
        raise WeightsError(f"cannot read stored weights at {uri!r}: only file:// stores are supported")
    folder = _local_path(uri)
    payload = bytearray(total_bytes)
    view = memoryview(payload)
    offset = 0
    for index in range(num_chunks):
        path = folder / f"{index:06d}.chunk"
        try:
            with open(path, "rb", buffering=0) as chunk:
                size = os.fstat(chunk.fileno()).st_size
                if offset + size > total_bytes:
                    raise WeightsError(f"stored chunks in {folder} hold more than the manifest's {total_bytes} bytes")
                got = 0
                while got < size:
                    read = chunk.readinto(view[offset + got : offset + size])
                    if not read:
                        raise WeightsError(f"stored chunk {path} shrank while being read")
                    got += read
        except FileNotFoundError as exc:
            raise WeightsError(
                f"stored chunk {path} is missing (deleted by retention, or never fully written)"
            ) from exc
        except OSError as exc:
            raise WeightsError(f"cannot read stored chunk {path}: {exc}") from exc
        offset += size
    if offset != total_bytes:
        raise WeightsError(f"stored chunks in {folder} hold {offset} bytes, the manifest says {total_bytes}")
    return payload


def _local_path(location: str) -> Path:
    if location.startswith("file://"):
        parsed = urlparse(location)
        return Path(unquote(parsed.path))
    return Path(location)


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
    _check_sha256(manifest, payload)
    return payload


def fetch(manifest: WeightChunk, pieces: dict[int, bytes]) -> bytearray:
    """The verified payload of a version: from its stored chunks when it has a ``store_uri``, else ``pieces``."""
    if manifest.store_uri is None:
        return assemble(manifest, pieces)
    payload = read_stored(manifest.store_uri, manifest.num_chunks, manifest.total_bytes)
    _check_sha256(manifest, payload)
    return payload


def _check_sha256(manifest: WeightChunk, payload: bytearray) -> None:
    if hashlib.sha256(payload).hexdigest() != manifest.sha256:
        raise WeightsError("payload failed its sha256 checksum")
