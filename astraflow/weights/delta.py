"""Sparse deltas of one tensor between two weight versions, bit-exact in the transfer dtype.

The idea is the AstraFlow paper's (and slime's bf16 weight sync): after an RL step with a small
learning rate most weights move by less than half a bf16 ulp, so their bf16 *bits* do not change
(the paper measures 98.4-99.2% unchanged). A delta carries only the positions of the elements
whose bits changed and what they changed to; applying it to the base reproduces the target bit for
bit. Everything here works on the raw bits (``int16`` for bf16, ``int32`` for fp32, ...), so -0.0,
NaN payloads and denormals survive unchanged.

Departures from the paper, which ships plain index arrays and the new values. Positions: each
tensor gets the smallest of

====== =================================================================================
none   nothing changed: an empty section.
raw    every value (``n`` elements); chosen when nearly everything changed, or with no base.
gapW   escape-coded gaps between changed indices as ``uint8``/``uint16``/``uint32`` (W=8/16/32).
bitmap ``np.packbits`` of the changed mask (one bit per element), for dense changes.
====== =================================================================================

Gap coding: ``gap[i] = idx[i] - idx[i-1] - 1`` (``idx[-1] = -1``) is written as ``gap // E``
escape words ``E = 2**W - 1`` (each: skip ``E`` elements, no value) followed by ``gap % E``. Unlike
a plain width choice, one large gap does not force a wider type, so at a few percent changed
``gap8`` costs about 8 bits per change, where plain ``uint32`` indices cost 32.

Values: the new bits (16 per change in bf16), or, with the suffix ``+d4``, the *difference* of the
integer bit patterns, new minus old, in 4 bits: a change of a few ulps inside one binade moves a
float's bit pattern by that many units, and after an AdamW step at lr 1e-6 on a 494M Qwen2, 88%
of the changed bf16 elements moved by exactly +-1 ulp and 97.5% by at most 7. The difference is
taken modulo 2**bits, so ``old + d`` is exact however the bits wrap; the nibble ``-8`` escapes to
the full new value, kept in order in an exceptions array.

Entropy coding, the suffix ``+z``: neither stream is uniform. At a few percent changed the gap bytes
of ``gap8`` carry ~6 bits of information, not 8, and the nibbles, mostly +-1, ~2 bits, not 4. So a
tensor whose position stream (or nibbles) is at least ``ENTROPY_MIN_BYTES`` long has them Huffman
coded (``entropy.py``) where that makes its section smaller. The values and exceptions stay as they
are (new bf16 bits are close to uniform).

Section layouts (little-endian, every part starts 8-byte aligned; ``k`` changed, ``n`` elements,
``e`` escaped values)::

    raw:        values[n]
    gapW:       k, words (uint64 x 2) | gaps[words] uintW | pad to 8 | values[k]
    bitmap:     k, bytes (uint64 x 2) | packbits(mask)[bytes] | pad to 8 | values[k]
    P+d4:       k, words, e (uint64 x 3) | stream of P | pad to 8 | nibbles[ceil(k/2)] | pad to 8 | exceptions[e]
    P+z:        k, words, zs (uint64 x 3) | deflated stream[zs] | pad to 8 | values[k]
    P+d4+z:     k, words, e, zs, zn (uint64 x 5) | deflated stream[zs] | pad to 8 | deflated nibbles[zn] | pad to 8 |
                exceptions[e]
    none:       (empty)

A ``+z`` section is inflated into its plain layout before it is checked: each deflated part must inflate to
exactly the bytes the header implies and end there, so a malformed one is refused before anything more is allocated.

Reading is two steps, so that a malformed section never leaves a half-written tensor behind: ``parse_section``
checks all that can be checked without the base (sizes, counts, every position inside the tensor), and
``apply_section`` then writes into the base in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from astraflow.core.errors import WeightsError
from astraflow.weights.entropy import deflate, inflate
from astraflow.weights.kernel import Found

GAP_DTYPES = {"gap8": np.dtype(np.uint8), "gap16": np.dtype(np.uint16), "gap32": np.dtype(np.uint32)}
POSITIONS = (*GAP_DTYPES, "bitmap")
D4 = "+d4"
Z = "+z"
PLAIN_ENCODINGS = ("none", "raw", *POSITIONS, *(p + D4 for p in POSITIONS))
ENCODINGS = (*PLAIN_ENCODINGS, *(p + Z for p in PLAIN_ENCODINGS[2:]))
ENTROPY_MIN_BYTES = 4096
"""Shorter streams are never deflated: what they could save is not worth a call."""
_D4_ESCAPE = 8
"""The nibble 0b1000 (-8): this change's new value is in the exceptions array."""
SCAN_ELEMENTS = 1 << 20  # elements compared at a time when looking for changes: the mask stays in cache, reused
BLOCK_WORDS = 1 << 14  # gap words decoded and applied at a time: their positions and values stay in the CPU cache
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)  # [256]: set bits of a byte
_D4_PAIRS = np.array([[((b & 15) ^ 8) - 8, ((b >> 4) ^ 8) - 8] for b in range(256)], dtype=np.int8)
"""[256, 2]: a packed byte's two signed 4-bit differences (low nibble first); one lookup decodes both."""


def pad8(nbytes: int) -> int:
    return (nbytes + 7) & ~7


def header_bytes(encoding: str) -> int:
    """Bytes of a plain section's header."""
    return 24 if encoding.endswith(D4) else 16


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


def encode_bits(
    new: np.ndarray, base: np.ndarray | None, entropy: bool = True, found: Found | None = None
) -> EncodedTensor:
    """The smallest section that turns ``base`` into ``new``, both [n] integer views of the bits.
    With ``entropy``, long streams are Huffman coded (``+z``) where that is smaller. ``found``: the changes, already
    listed (``kernel.cast_and_find``: the same bytes, sooner)."""
    encoded = _plain_bits(new, base, found)
    return _entropy_coded(encoded) if entropy and encoded.encoding not in ("none", "raw") else encoded


def _plain_bits(new: np.ndarray, base: np.ndarray | None, found: Found | None) -> EncodedTensor:
    n, width = new.size, new.itemsize
    if base is None or base.shape != new.shape or base.dtype != new.dtype:
        return EncodedTensor("raw", (new,), n)
    idx = found[0] if found else _changed_sparsely(new, base)  # [k] int64, increasing; None past n/8 changed
    mask = new != base if idx is None else None  # [n] bool, only for dense changes
    k = int(np.count_nonzero(mask)) if idx is None else idx.size
    if k == 0:
        return EncodedTensor("none", (), 0)
    if 16 + min(pad8(k), pad8((n + 7) // 8)) + (k + 1) // 2 >= n * width:  # no sparse form can win
        return EncodedTensor("raw", (new,), k)
    if idx is None:
        idx = np.flatnonzero(mask)
    gaps = np.empty(k, dtype=np.int64)
    gaps[0] = idx[0]
    np.subtract(idx[1:], idx[:-1], out=gaps[1:])
    gaps[1:] -= 1
    position_name, position_bytes = _cheapest_positions(gaps, n)
    new_values, old_values = found[1:] if found else (new[idx], base[idx])  # [k], [k]
    diffs = new_values - old_values  # [k], modulo 2**bits
    small = _fits_d4(diffs) if width in (2, 4) else None
    escaped = k - int(np.count_nonzero(small)) if small is not None else k
    d4_bytes = 8 + pad8((k + 1) // 2) + escaped * width
    use_d4 = small is not None and d4_bytes < k * width
    total = 16 + position_bytes + (d4_bytes if use_d4 else k * width)
    if total >= n * width:
        return EncodedTensor("raw", (new,), k)
    if position_name == "bitmap":
        if mask is None:
            mask = np.zeros(n, dtype=bool)
            mask[idx] = True
        stream = np.packbits(mask)  # [ceil(n/8)] uint8
    else:
        stream = _gap_stream(gaps, GAP_DTYPES[position_name])
    if not use_d4:
        return EncodedTensor(position_name, (np.array([k, stream.size], dtype="<u8"), stream, new_values), k)
    nibbles = np.zeros(k + k % 2, dtype=np.uint8)  # [k rounded up to even]
    np.bitwise_and(diffs.astype(np.uint8), 0x0F, out=nibbles[:k])
    nibbles[:k][~small] = _D4_ESCAPE
    packed = nibbles[0::2] | (nibbles[1::2] << 4)  # [ceil(k/2)] uint8
    header = np.array([k, stream.size, escaped], dtype="<u8")
    return EncodedTensor(position_name + D4, (header, stream, packed, new_values[~small]), k)


@dataclass(frozen=True)
class Section:
    """A parsed, checked section of one tensor (views into the payload, nothing copied)."""

    encoding: str
    n: int
    k: int
    stream: np.ndarray | None
    """Gap words or bitmap bytes; ``None`` for ``none`` and ``raw``."""
    values: np.ndarray | None
    """[n] bits (``raw``), [k] new bits, or [ceil(k/2)] packed 4-bit differences (``+d4``)."""
    exceptions: np.ndarray | None = None
    """``+d4``: [e] new bits of the changes whose difference did not fit in 4 bits."""
    escapes: int = 0
    """Escape words in a gap stream."""

    @property
    def needs_base(self) -> bool:
        return self.encoding != "raw"


def parse_section(encoding: str, section: np.ndarray, n: int, dtype: np.dtype) -> Section:
    """Check ``section`` (uint8, 8-byte aligned) against its encoding and ``n`` elements of ``dtype``.

    Raises ``WeightsError`` unless every size and count agrees and every position is below ``n``.
    """
    if encoding.endswith(Z) and encoding in ENCODINGS:
        plain = encoding.removesuffix(Z)
        return parse_section(plain, _inflated(plain, section, n, dtype.itemsize), n, dtype)
    width = dtype.itemsize
    if encoding == "raw":
        _expect(section.nbytes == n * width, f"raw section of {section.nbytes} bytes for {n} elements")
        return Section(encoding, n, n, None, section.view(dtype))
    if encoding == "none":
        _expect(section.nbytes == 0, f"none section of {section.nbytes} bytes")
        return Section(encoding, n, 0, None, None)
    positions = encoding.removesuffix(D4)
    if encoding not in ENCODINGS:
        raise WeightsError(f"unknown tensor encoding {encoding!r}; expected one of {ENCODINGS}")
    d4 = encoding.endswith(D4)
    head = header_bytes(encoding)
    _expect(section.nbytes >= head, "delta section shorter than its header")
    k, words, *rest = (int(v) for v in section[:head].view("<u8"))
    escaped = rest[0] if d4 else 0
    stream_dtype = GAP_DTYPES.get(positions, np.dtype(np.uint8))
    at = head + pad8(words * stream_dtype.itemsize)
    value_bytes = (pad8((k + 1) // 2) + escaped * width) if d4 else k * width
    _expect(
        k <= n and section.nbytes == at + value_bytes, f"{encoding} section of {section.nbytes} bytes for {k} changes"
    )
    stream = section[head : head + words * stream_dtype.itemsize].view(stream_dtype)
    if positions == "bitmap":
        _expect(words == (n + 7) // 8, f"bitmap of {words} bytes for {n} elements")
        _expect(n % 8 == 0 or int(stream[-1]) & ((1 << (8 - n % 8)) - 1) == 0, "bitmap marks elements past the end")
        _expect(int(_POPCOUNT[stream].sum(dtype=np.int64)) == k, "bitmap population differs from its change count")
    else:
        escape = np.iinfo(stream_dtype).max
        escapes = int(np.count_nonzero(stream == escape))
        _expect(words - escapes == k, "gap stream holds a different number of changes than its header")
        _expect(words == 0 or int(stream[-1]) != escape, "gap stream ends in an escape")
        _expect(k == 0 or int(stream.sum(dtype=np.uint64)) + k - 1 < n, f"a changed index reaches past {n} elements")
    escapes = words - k if positions in GAP_DTYPES else 0
    if not d4:
        return Section(encoding, n, k, stream, section[at:].view(dtype), escapes=escapes)
    packed = section[at : at + (k + 1) // 2]
    marks = int(np.count_nonzero((packed & 0x0F) == _D4_ESCAPE)) + int(np.count_nonzero((packed >> 4) == _D4_ESCAPE))
    _expect(k % 2 == 0 or int(packed[-1]) >> 4 == 0, "4-bit differences padded with a nonzero nibble")
    _expect(marks == escaped, f"{marks} escaped differences, the header says {escaped}")
    return Section(encoding, n, k, stream, packed, section[at + pad8((k + 1) // 2) :].view(dtype), escapes)


def apply_section(section: Section, target: np.ndarray) -> None:
    """Write a parsed section into ``target`` ([n] bits of the base), in place.

    Gap streams are decoded ``BLOCK_WORDS`` at a time, so that the positions and values in flight
    stay in the CPU cache instead of making several passes over arrays as long as the changes.
    """
    if section.encoding == "none":
        return
    if section.encoding == "raw":
        np.copyto(target, section.values)
        return
    writer = _ChangeWriter(section, target)
    if section.encoding.startswith("bitmap"):
        writer.write(np.flatnonzero(np.unpackbits(section.stream, count=section.n)))
        return
    escape = np.iinfo(section.stream.dtype).max
    previous = -1  # position of the last change before the block
    buffer = np.empty(min(BLOCK_WORDS, section.stream.size), dtype=np.int64)  # reused: no allocation per block
    for start in range(0, section.stream.size, BLOCK_WORDS):
        words = section.stream[start : start + BLOCK_WORDS]
        steps = np.add(
            words, 1, dtype=np.int64, out=buffer[: words.size]
        )  # [block] a change word moves gap + 1 elements
        is_escape = words == escape if section.escapes else None
        if is_escape is not None and is_escape.any():
            steps[is_escape] = escape  # an escape word moves E elements and is no change
        else:
            is_escape = None
        steps[0] += previous
        np.cumsum(steps, out=steps)  # [block] position reached after each word
        previous = int(steps[-1])
        writer.write(steps if is_escape is None else steps[~is_escape])


class _ChangeWriter:
    """Writes a sparse section's changes into ``target`` in consecutive runs of positions."""

    def __init__(self, section: Section, target: np.ndarray) -> None:
        self.section, self.target = section, target
        self.done = 0  # changes written
        self.escaped = 0  # exceptions used
        self.pairs = _D4_PAIRS.astype(target.dtype) if section.exceptions is not None else None

    def write(self, positions: np.ndarray) -> None:
        """The next ``positions.size`` changes, at these positions."""
        section, first, count = self.section, self.done, positions.size
        self.done += count
        if self.pairs is None:
            self.target[positions] = section.values[first : first + count]
            return
        low = first // 2
        diffs = np.take(self.pairs, section.values[low : (first + count + 1) // 2], axis=0).reshape(-1)  # [>= count]
        diffs = diffs[first - 2 * low : first - 2 * low + count]
        values = self.target[positions]  # old bits
        values += diffs  # modulo 2**bits
        if section.exceptions.size:
            escaped = np.flatnonzero(diffs == -_D4_ESCAPE)
            values[escaped] = section.exceptions[self.escaped : self.escaped + escaped.size]
            self.escaped += escaped.size
        self.target[positions] = values


def decode_section(section: Section, base: np.ndarray | None) -> np.ndarray:
    """The [n] bits of a tensor, leaving ``base`` untouched: ``base`` itself for ``none``, a view
    of the payload for ``raw``, otherwise a new array."""
    if section.encoding == "raw":
        return section.values
    if base is None:
        raise WeightsError(f"a {section.encoding} delta needs a base")
    if section.encoding == "none":
        return base
    out = base.copy()
    apply_section(section, out)
    return out


def _changed_sparsely(new: np.ndarray, base: np.ndarray) -> np.ndarray | None:
    """[k] indices where ``new`` and ``base`` differ, found a slice at a time (no [n] temporaries);
    ``None`` as soon as more than n/8 differ, where a bitmap beats any gap stream anyway."""
    n = new.size
    limit = n // 8
    mask = np.empty(min(n, SCAN_ELEMENTS), dtype=bool)
    found, count = [], 0
    for start in range(0, n, SCAN_ELEMENTS):
        part = mask[: min(SCAN_ELEMENTS, n - start)]
        np.not_equal(new[start : start + part.size], base[start : start + part.size], out=part)
        idx = np.flatnonzero(part)
        count += idx.size
        if count > limit:
            return None
        if idx.size:
            idx += start
            found.append(idx)
    return found[0] if len(found) == 1 else np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def _cheapest_positions(gaps: np.ndarray, n: int) -> tuple[str, int]:
    """The position coding of [k] gaps with the fewest bytes, and those bytes (stream, padded)."""
    k = gaps.size
    sizes = {"bitmap": pad8((n + 7) // 8)}
    for name, dtype in GAP_DTYPES.items():
        escape = np.iinfo(dtype).max
        long_gaps = gaps[gaps >= escape]
        sizes[name] = pad8((k + int((long_gaps // escape).sum())) * dtype.itemsize)
        if not long_gaps.size:  # no escapes: every wider type only costs more
            break
    best = min(sizes, key=sizes.__getitem__)
    return best, sizes[best]


def _fits_d4(diffs: np.ndarray) -> np.ndarray:
    """[k] bool: the difference lies in [-7, 7] (modulo 2**bits)."""
    unsigned = np.dtype(f"u{diffs.itemsize}")
    shifted = diffs + diffs.dtype.type(7)  # [-7, 7] -> [0, 14]; everything else wraps above 14
    return shifted.view(unsigned) <= 14


def _gap_stream(gaps: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """[k] gaps → escape-coded words: ``gap // E`` escapes ``E`` then ``gap % E`` per change."""
    escape = np.iinfo(dtype).max
    stream = gaps.astype(dtype)  # [k]; right except where a gap needs escapes
    long = np.flatnonzero(gaps >= escape)
    if not long.size:
        return stream
    stream[long] = gaps[long] % escape
    return np.insert(stream, np.repeat(long, gaps[long] // escape), escape)


def _entropy_coded(plain: EncodedTensor) -> EncodedTensor:
    """``plain`` with its position stream and nibbles deflated (``+z``), if that makes it smaller."""
    d4 = plain.encoding.endswith(D4)
    header, stream, *rest = plain.parts
    packed = rest[0] if d4 else None
    if stream.nbytes < ENTROPY_MIN_BYTES and (packed is None or packed.nbytes < ENTROPY_MIN_BYTES):
        return plain
    deflated = [deflate(stream)] + ([deflate(packed)] if d4 else [])
    head = np.array([*header, *(part.size for part in deflated)], dtype="<u8")
    coded = EncodedTensor(plain.encoding + Z, (head, *deflated, rest[-1]), plain.changed)
    return coded if coded.nbytes < plain.nbytes else plain


def _inflated(plain: str, section: np.ndarray, n: int, width: int) -> np.ndarray:
    """The plain section (uint8) a ``+z`` one stands for, checked to inflate exactly to it."""
    d4 = plain.endswith(D4)
    head = header_bytes(plain) + (16 if d4 else 8)
    _expect(section.nbytes >= head, "delta section shorter than its header")
    k, words, *rest = (int(v) for v in section[:head].view("<u8"))
    escaped, zs, zn = (rest[0], rest[1], rest[2]) if d4 else (0, rest[0], 0)
    item = GAP_DTYPES.get(plain.removesuffix(D4), np.dtype(np.uint8)).itemsize
    _expect(k <= n and words <= n and escaped <= k, f"{plain}{Z} header counts past {n} elements")
    parts = [(zs, words * item)] + ([(zn, (k + 1) // 2)] if d4 else [])
    at, plain_parts = head, []
    for size, expected in parts:
        _expect(at + size <= section.nbytes, f"{plain}{Z} section of {section.nbytes} bytes ends inside a stream")
        inflated = inflate(section[at : at + size], expected)
        _expect(inflated is not None, f"{plain}{Z} stream does not inflate to exactly its {expected} bytes")
        plain_parts.append(inflated)
        at = pad8(at + size)
    pieces = [np.array([k, words, escaped][: 3 if d4 else 2], dtype="<u8").view(np.uint8)]
    for part in plain_parts:
        pieces += [part, np.zeros(pad8(part.nbytes) - part.nbytes, dtype=np.uint8)]
    return np.concatenate([*pieces, section[at:]])  # the plain parse checks the values' length


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise WeightsError(f"malformed delta: {problem}")
