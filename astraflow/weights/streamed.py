"""A streamed publish: tensors are encoded on several threads while the chunks before them are sent.

The serial publish (``weights.encode_workers: 0``) copies the whole state dict to the transfer
dtype, encodes every tensor on one core, hashes the payload, and only then sends its first chunk:
at 7B that is ~17 s a version before the first byte leaves. Here, steps 1-3 of a publish
(``publish.py``) overlap:

1. Each tensor's copy to the transfer dtype and its section (``delta.encode_bits``) are one job on
   a pool of ``workers`` threads. torch's copy and numpy's compare, gather and search release the
   GIL, so the jobs run on all cores; no Python runs per element. Ties are found in the caller's
   thread, in tensor order, as ``payload.to_transfer`` finds them, and at most ``2 x workers``
   tensors are in flight (a sharded model's gathered weights are made as they are read).
2. The caller takes the sections back in tensor order and lays them out exactly as
   ``payload.build_payload`` does (same offsets, same padding: the payload is the serial one byte
   for byte), cutting a chunk every ``chunk_bytes`` and sending it at once, while later tensors
   are still being encoded. The payload's sha256 is computed on the way.
3. The payload's sha256 is not known while chunks go out, so they carry a random ``publish_id``
   (the manifest carries it too) instead; and each chunk lists the specs of the sections that
   ended in it or before it and were not listed yet, so that a reader can apply them before the
   manifest comes (to a copy it shows no one until the manifest verifies: ``shadow.py``).

The manifest still goes last (``publish.py``, step 4), signed, with every spec: a reader that
ignores the chunks' specs assembles and checks the version exactly as for a serial publish.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping

import numpy as np
import torch

from astraflow.log import Producer
from astraflow.runtime.context import now_ms
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import TensorSpec, WeightChunk
from astraflow.weights import kernel
from astraflow.weights.delta import EncodedTensor, encode_bits, pad8
from astraflow.weights.payload import TRANSFER_DTYPES, dtype_name, tensor_bits, tie_key

Job = tuple[torch.Tensor, EncodedTensor]
"""A tensor's transfer-dtype copy and its section."""


@dataclass(frozen=True)
class StreamedChunks:
    """What a streamed publish sent, for its manifest, and what it keeps as the next delta's base."""

    publish_id: str
    sha256: str
    total_bytes: int
    num_chunks: int
    specs: list[TensorSpec]
    transfer: dict[str, torch.Tensor]
    """The transfer-dtype copy of the weights, tied tensors tied (as ``to_transfer`` makes it)."""
    changes: list[tuple[str, int, int]]
    """(name, elements, changed elements) of each stored tensor."""
    encode_seconds: float
    """From the start until the last section was laid out (chunks went out meanwhile)."""


def stream_chunks(
    producer: Producer,
    codec: Codec,
    topic: str,
    outline: WeightChunk,
    state: Mapping[str, torch.Tensor],
    transfer_dtype: str,
    base: Mapping[str, torch.Tensor] | None,
    reuse: Mapping[str, torch.Tensor] | None,
    chunk_bytes: int,
    workers: int,
    entropy: bool = True,
    compiled: bool = True,
) -> StreamedChunks:
    """Encode ``state`` against ``base`` (full when ``None``) on ``workers`` threads and send its chunks
    as they fill (steps 1-3 above); ``reuse``: an earlier copy to overwrite (``to_transfer``); ``entropy``:
    Huffman-code long streams (``delta.encode_bits``); ``compiled``: cast float32 to bf16 and find the
    changes in one pass of the C kernel (``kernel.py``) where it can."""
    started = time.perf_counter()
    publish_id = secrets.token_hex(16)
    key = f"{outline.policy}:{outline.version}".encode()

    def send(index: int, data: bytes, specs: list[TensorSpec]) -> None:
        chunk = replace(
            outline,
            kind="chunk",
            chunk_index=index,
            num_chunks=0,
            total_bytes=0,
            sha256="",
            data=data,
            tensors=specs,
            created_ms=now_ms(),
            publish_id=publish_id,
        )
        producer.send(topic, codec.encode(chunk), key=key, partition=WEIGHTS_CHUNK_PARTITION)

    chunker = _Chunker(send, chunk_bytes)
    transfer: dict[str, torch.Tensor] = {}
    specs: list[TensorSpec] = []
    changes: list[tuple[str, int, int]] = []
    written: dict[str, TensorSpec] = {}
    offset = 0
    with ThreadPoolExecutor(workers, thread_name_prefix="weights-encode") as pool:
        window: deque[tuple[str, Future[Job] | str]] = deque()
        target = TRANSFER_DTYPES[transfer_dtype]
        jobs = _submit(pool, state, target, base, reuse, entropy, compiled and kernel.library() is not None)
        for item in _ahead(jobs, window, 2 * workers):
            name, job = item
            if isinstance(job, str):  # tied to ``job`` here and in the base: stored once
                spec = replace(written[job], name=name)
                transfer[name] = transfer[job]
            else:
                copied, encoded = job.result()
                spec = TensorSpec(
                    name, dtype_name(copied.dtype), list(copied.shape), offset, encoded.nbytes, encoded.encoding
                )
                chunker.section(offset, encoded.parts)
                transfer[name] = copied
                changes.append((name, copied.numel(), encoded.changed))
                offset = pad8(offset + encoded.nbytes)
            written[name] = spec
            specs.append(spec)
            chunker.specs.append(spec)
    chunker.pad_to(offset)
    encoded_at = time.perf_counter()
    num_chunks = chunker.finish()
    return StreamedChunks(
        publish_id,
        chunker.hasher.hexdigest(),
        offset,
        num_chunks,
        specs,
        transfer,
        changes,
        encoded_at - started,
    )


def _ahead(jobs: Iterator, window: deque, depth: int) -> Iterator:
    """The items of ``jobs`` in order, pulling up to ``depth`` ahead (each pull submits a job)."""
    for job in jobs:
        window.append(job)
        if len(window) >= depth:
            yield window.popleft()
    while window:
        yield window.popleft()


def _submit(
    pool: ThreadPoolExecutor,
    state: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    base: Mapping[str, torch.Tensor] | None,
    reuse: Mapping[str, torch.Tensor] | None,
    entropy: bool,
    compiled: bool,
) -> Iterator[tuple[str, Future[Job] | str]]:
    """(name, its job) per tensor, submitted as pulled; a name tied to an earlier one here and in the
    base gets that name instead. Ties as in ``to_transfer`` (``tie_key``)."""
    seen: dict[tuple, tuple[weakref.ref, str, Future[Job]]] = {}
    taken: set[int] = set()
    for name, given in state.items():
        tensor = given.detach()
        key = tie_key(tensor)
        old = base.get(name) if base is not None else None
        source, twin, future = seen.get(key, (None, "", None))
        if source is not None and source() is not None:  # tied to ``twin``
            tied_in_base = base is None or old is base.get(twin)
            yield name, twin if tied_in_base else pool.submit(_encode_tied, future, old, entropy)
            continue
        target = dtype if tensor.is_floating_point() else tensor.dtype
        dtype_name(target)  # an unsupported dtype fails before any chunk of it is sent
        spare = reuse.get(name) if reuse is not None else None
        if spare is None or spare.dtype != target or spare.shape != tensor.shape or id(spare) in taken:
            spare = None
        else:
            taken.add(id(spare))
        fused = compiled and _fusable(tensor, target, old)
        future = pool.submit(_cast_and_encode if fused else _copy_and_encode, tensor, target, spare, old, entropy)
        seen[key] = (weakref.ref(given), name, future)
        yield name, future


def _copy_and_encode(tensor: torch.Tensor, dtype: torch.dtype, spare: torch.Tensor | None, old, entropy: bool) -> Job:
    if spare is not None:
        copied = spare.copy_(tensor)
    else:
        copied = tensor.to(device="cpu", dtype=dtype, copy=True).contiguous()  # copy: never alias the model
    return copied, _encode(copied, old, entropy)


def _fusable(tensor: torch.Tensor, dtype: torch.dtype, old: torch.Tensor | None) -> bool:
    """Whether the C kernel can cast ``tensor`` and compare it with ``old`` (float32 -> bf16, all on the CPU)."""
    plain = tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.dtype == torch.float32
    return plain and dtype == torch.bfloat16 and old is not None and old.dtype == dtype and old.shape == tensor.shape


def _cast_and_encode(tensor: torch.Tensor, dtype: torch.dtype, spare: torch.Tensor | None, old, entropy: bool) -> Job:
    """``_copy_and_encode``'s copy and section, the same bytes, with the cast and the search for changes fused."""
    copied = spare if spare is not None else torch.empty(tensor.shape, dtype=dtype)
    bits, old_bits = tensor_bits(copied), tensor_bits(old.contiguous())
    found = kernel.cast_and_find(tensor.reshape(-1).numpy(), old_bits, bits, bits.size // 8)
    return copied, encode_bits(bits, old_bits, entropy, found)


def _encode_tied(twin: Future[Job], old: torch.Tensor | None, entropy: bool) -> Job:
    """A tensor tied to an earlier one that its base does not tie: the same copy, its own section."""
    copied = twin.result()[0]
    return copied, _encode(copied, old, entropy)


def _encode(copied: torch.Tensor, old: torch.Tensor | None, entropy: bool) -> EncodedTensor:
    usable = old is not None and old.dtype == copied.dtype and old.shape == copied.shape
    return encode_bits(tensor_bits(copied), tensor_bits(old) if usable else None, entropy)


class _Chunker:
    """Lays sections out as ``build_payload`` does and sends a chunk each time ``size`` bytes are in."""

    def __init__(self, send: Callable[[int, bytes, list[TensorSpec]], None], size: int) -> None:
        self.send, self.size = send, size
        self.buffer = np.empty(size, dtype=np.uint8)
        self.filled = 0
        self.position = 0
        """Payload bytes laid out so far."""
        self.count = 0
        self.specs: list[TensorSpec] = []
        """Specs whose sections are laid out, for the next chunk sent."""
        self.hasher = hashlib.sha256()

    def section(self, offset: int, parts: tuple[np.ndarray, ...]) -> None:
        """One tensor's parts from ``offset`` on, each but the first after padding to 8 bytes."""
        self.pad_to(offset)
        for part in parts:
            self.pad_to(pad8(self.position))
            self.write(part.reshape(-1).view(np.uint8))

    def pad_to(self, offset: int) -> None:
        if offset > self.position:
            self.write(np.zeros(offset - self.position, dtype=np.uint8))

    def write(self, data: np.ndarray) -> None:
        at = 0
        while at < data.size:
            take = min(self.size - self.filled, data.size - at)
            self.buffer[self.filled : self.filled + take] = data[at : at + take]
            self.filled += take
            at += take
            if self.filled == self.size:
                self._flush()
        self.position += data.size

    def finish(self) -> int:
        """Send what is left (at least one chunk in all); the number of chunks sent."""
        if self.filled or self.specs or not self.count:
            self._flush()
        return self.count

    def _flush(self) -> None:
        data = self.buffer[: self.filled].tobytes()
        self.hasher.update(data)
        self.send(self.count, data, self.specs)
        self.count += 1
        self.specs = []
        self.filled = 0
