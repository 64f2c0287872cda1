"""Huffman coding of a delta's byte streams (``delta.py``'s ``+z`` sections), with zlib.

Raw deflate (no zlib header or checksum: the manifest's sha256 covers the payload) with the
``Z_HUFFMAN_ONLY`` strategy: no string matching, only Huffman codes of the bytes, which is what
gap words and packed 4-bit differences gain from (they hold no repeated strings worth finding).
It runs at hundreds of MB/s where deflate's default search runs at tens, releases the GIL (the
streamed publish encodes tensors on several threads), and its code tables are per block of symbols,
so they follow the statistics along a tensor.
"""

from __future__ import annotations

import zlib

import numpy as np


def deflate(part: np.ndarray) -> np.ndarray:
    """[m] uint8: ``part``'s bytes, Huffman coded."""
    coder = zlib.compressobj(1, zlib.DEFLATED, -15, 9, zlib.Z_HUFFMAN_ONLY)
    data = memoryview(np.ascontiguousarray(part).reshape(-1).view(np.uint8))
    return np.frombuffer(coder.compress(data) + coder.flush(), dtype=np.uint8)


def inflate(data: np.ndarray, expected: int) -> np.ndarray | None:
    """[expected] uint8 inflated from all of ``data``; ``None`` unless ``data`` is one complete deflate
    stream of exactly ``expected`` bytes (never more is inflated than that)."""
    inflater = zlib.decompressobj(-15)
    try:
        out = inflater.decompress(memoryview(np.ascontiguousarray(data)), expected + 1)  # + 1: a longer one shows
    except zlib.error:
        return None
    if len(out) != expected or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        return None
    return np.frombuffer(out, dtype=np.uint8)
