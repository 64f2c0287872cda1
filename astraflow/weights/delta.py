"""Sparse deltas of one tensor between two weight versions, bit-exact in the transfer dtype.

The idea is the AstraFlow paper's (and slime's bf16 weight sync): after an RL step with a small
learning rate most weights move by less than half a bf16 ulp, so their bf16 *bits* do not change
(the paper measures 98.4-99.2% unchanged). A delta carries only the flat indices of the elements
whose bits changed and their new values; writing those values into the base reproduces the target
bit for bit. Everything here works on the raw bits (``int16`` for bf16, ``int32`` for fp32, ...),
so -0.0, NaN payloads and denormals survive unchanged.

Departure from the paper, which ships plain index arrays: each tensor gets the smallest of

====== =================================================================================
none   nothing changed: an empty section.
raw    every value (``n`` elements); chosen when nearly everything changed, or with no base.
gapW   escape-coded gaps between changed indices as ``uint8``/``uint16``/``uint32`` (W=8/16/32).
bitmap ``np.packbits`` of the changed mask (one bit per element), for dense changes.
====== =================================================================================

Gap coding: ``gap[i] = idx[i] - idx[i-1] - 1`` (``idx[-1] = -1``) is written as ``gap // E``
escape words ``E = 2**W - 1`` (each: skip ``E`` elements, no value) followed by ``gap % E``. Unlike
a plain width choice, one large gap does not force a wider type, so at a few percent changed
``gap8`` costs about 8 bits per change: ~91% of the entropy bound (position entropy + 16 bits per
value) at the 4.2% change of a first bf16 step, where plain ``uint32`` indices reach ~45%.
zlib on the gap stream would close most of the rest but runs at tens of MB/s; not worth it here.

Section layouts (little-endian, every part starts 8-byte aligned; ``k`` changed, ``n`` elements)::

    raw:        values[n]
    gapW:       k, words (uint64 x 2) | gaps[words] uintW | pad to 8 | values[k]
    bitmap:     k, bytes (uint64 x 2) | packbits(mask)[bytes] | pad to 8 | values[k]
    none:       (empty)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from astraflow.errors import WeightsError

HEADER_BYTES = 16
GAP_DTYPES = {"gap8": np.dtype(np.uint8), "gap16": np.dtype(np.uint16), "gap32": np.dtype(np.uint32)}
ENCODINGS = ("none", "raw", "bitmap", *GAP_DTYPES)


def pad8(nbytes: int) -> int:
    return (nbytes + 7) & ~7


@dataclass(frozen=True)
class EncodedTensor:
    """One tensor's section: its encoding, its parts in order, and how many elements changed."""

    encoding: str
    parts: tuple[np.ndarray, ...]
    changed: int

    @property
    def nbytes(self) -> int:
        """Section length: every part but the last padded to 8 bytes."""
        sizes = [part.nbytes for part in self.parts]
        return sum(pad8(size) for size in sizes[:-1]) + (sizes[-1] if sizes else 0)


def encode_bits(new: np.ndarray, base: np.ndarray | None) -> EncodedTensor:
    """The smallest section that turns ``base`` into ``new``; both [n] integer views of the bits."""
    n, width = new.size, new.itemsize
    if base is None or base.shape != new.shape or base.dtype != new.dtype:
        return EncodedTensor("raw", (new,), n)
    mask = new != base  # [n] bool
    k = int(np.count_nonzero(mask))
    if k == 0:
        return EncodedTensor("none", (), 0)
    candidates = {"raw": n * width, "bitmap": HEADER_BYTES + pad8((n + 7) // 8) + k * width}
    if HEADER_BYTES + pad8(k) + k * width < min(candidates.values()):  # gap8's floor beats both
        idx = np.flatnonzero(mask)  # [k] int64, increasing
        gaps = np.diff(idx, prepend=-1) - 1  # [k] >= 0
        largest = int(gaps.max())
        for name, dtype in GAP_DTYPES.items():
            escape = np.iinfo(dtype).max
            words = k if largest < escape else k + int((gaps // escape).sum())
            candidates[name] = HEADER_BYTES + pad8(words * dtype.itemsize) + k * width
            if largest < escape:  # no escapes: every wider type only costs more
                break
    best = min(candidates, key=candidates.__getitem__)
    if best == "raw":
        return EncodedTensor("raw", (new,), k)
    if best == "bitmap":
        stream = np.packbits(mask)  # [ceil(n/8)] uint8
        values = new[mask]  # [k]
    else:
        stream = _gap_stream(gaps, GAP_DTYPES[best])
        values = new[idx]  # [k]
    header = np.array([k, stream.size], dtype="<u8")
    return EncodedTensor(best, (header, stream, values), k)


def decode_bits(encoding: str, section: np.ndarray, n: int, dtype: np.dtype, base: np.ndarray | None) -> np.ndarray:
    """The [n] bits of a tensor from its ``section`` (uint8, 8-byte aligned) and its base bits.

    Returns ``base`` itself for ``none`` and a view of ``section`` for ``raw``; otherwise a new
    array. Raises ``WeightsError`` when the section does not fit its encoding, size or base.
    """
    width = dtype.itemsize
    if encoding == "raw":
        _expect(section.nbytes == n * width, f"raw section of {section.nbytes} bytes for {n} elements")
        return section.view(dtype)
    if base is None or base.size != n or base.dtype != dtype:
        raise WeightsError(f"a {encoding} delta needs a base of {n} {dtype} elements")
    if encoding == "none":
        _expect(section.nbytes == 0, f"none section of {section.nbytes} bytes")
        return base
    if encoding not in GAP_DTYPES and encoding != "bitmap":
        raise WeightsError(f"unknown tensor encoding {encoding!r}; expected one of {ENCODINGS}")
    _expect(section.nbytes >= HEADER_BYTES, "delta section shorter than its header")
    k, words = (int(v) for v in section[:HEADER_BYTES].view("<u8"))
    stream_dtype = GAP_DTYPES.get(encoding, np.dtype(np.uint8))
    values_at = HEADER_BYTES + pad8(words * stream_dtype.itemsize)
    _expect(section.nbytes == values_at + k * width, f"{encoding} section of {section.nbytes} bytes for {k} changes")
    stream = section[HEADER_BYTES : HEADER_BYTES + words * stream_dtype.itemsize].view(stream_dtype)
    values = section[values_at:].view(dtype)  # [k]
    out = base.copy()
    if encoding == "bitmap":
        _expect(words == (n + 7) // 8, f"bitmap of {words} bytes for {n} elements")
        mask = np.unpackbits(stream, count=n).view(bool)  # [n]
        _expect(int(np.count_nonzero(mask)) == k, "bitmap population differs from its change count")
        out[mask] = values
    else:
        out[_gap_positions(stream, k, n)] = values
    return out


def _gap_stream(gaps: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """[k] gaps → escape-coded words: ``gap // E`` escapes ``E`` then ``gap % E`` per change."""
    escape = np.iinfo(dtype).max
    escapes = gaps // escape  # [k]
    if not escapes.any():
        return gaps.astype(dtype)
    slots = np.cumsum(escapes + 1) - 1  # [k] word index of each change
    stream = np.full(int(slots[-1]) + 1, escape, dtype=dtype)
    stream[slots] = gaps % escape
    return stream


def _gap_positions(stream: np.ndarray, k: int, n: int) -> np.ndarray:
    """Escape-coded words → [k] flat indices, strictly increasing and below ``n``."""
    is_change = stream != np.iinfo(stream.dtype).max  # [words]
    _expect(int(np.count_nonzero(is_change)) == k, "gap stream holds a different number of changes than its header")
    positions = np.cumsum(stream, dtype=np.int64)[is_change] + np.arange(k)  # [k]
    _expect(k == 0 or int(positions[-1]) < n, f"a changed index reaches past {n} elements")
    return positions


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise WeightsError(f"malformed delta: {problem}")
