"""The C kernel of a bf16 delta's encoding (``cast_find.c``), compiled once per machine and loaded with ctypes.

``cast_and_find`` casts a float32 tensor to bf16 into its transfer copy and lists the elements
whose bits differ from the previous version's, in one pass over memory instead of numpy's three
(``delta.py`` then codes the positions and values as before; the bytes are the same). The source
is compiled with the machine's C compiler (``$CC``, else ``cc``/``gcc``) into
``$ASTRAFLOW_CACHE/kernels``, named by the source's hash, so an edit rebuilds it and a machine
builds it once. ctypes releases the GIL for the call, so the encoding pool's threads run it on
every core. Without a compiler the encoding falls back to numpy's passes (same bytes, slower) and
says so once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from astraflow.core.rundir import cache_root

logger = logging.getLogger(__name__)

SOURCE = "cast_find.c"
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c99")


def compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate.split()[0]):
            return candidate
    return None


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (with one warning) where it cannot be built."""
    source = resources.files("astraflow.weights").joinpath(SOURCE).read_bytes()
    tag = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"cast_find-{tag}-{platform.machine()}.so"
    if not target.exists():
        cc = compiler()
        if cc is None:
            logger.warning(
                "weights: no C compiler ($CC, cc, gcc); bf16 deltas are encoded with numpy (slower): "
                "install one (Debian: apt-get install gcc)"
            )
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            code, built = Path(scratch) / SOURCE, Path(scratch) / target.name
            code.write_bytes(source)
            done = subprocess.run([*cc.split(), *FLAGS, "-o", str(built), str(code)], capture_output=True, text=True)
            if done.returncode != 0:
                logger.warning(
                    "weights: compiling %s with %s failed; bf16 deltas are encoded with numpy (slower):\n%s",
                    SOURCE,
                    cc,
                    done.stderr[-2000:],
                )
                return None
            os.replace(built, target)  # atomic: a concurrent build loads one whole file or the other
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as error:  # built elsewhere for another C library, say
        logger.warning("weights: loading %s failed (%s); bf16 deltas are encoded with numpy (slower)", target, error)
        return None
    lib.cast_and_find.restype = ctypes.c_int64
    lib.cast_and_find.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    return lib


Found = tuple[np.ndarray, np.ndarray, np.ndarray]
"""[k] int64 increasing indices of the changed elements, [k] their new bits, [k] their old bits."""


def cast_and_find(src: np.ndarray, old: np.ndarray, out: np.ndarray, limit: int) -> Found | None:
    """Fill ``out`` ([n] 16-bit integers) with the bf16 bits of ``src`` ([n] float32) and return where they
    differ from ``old`` ([n], out's dtype); ``None`` when more than ``limit`` differ (``out`` is filled all
    the same). All contiguous; needs ``library()``."""
    lib = library()
    assert lib is not None and src.dtype == np.float32 and old.dtype == out.dtype and out.dtype.itemsize == 2
    assert src.size == old.size == out.size and all(a.flags.c_contiguous for a in (src, old, out))
    slack = ctypes.c_int64.in_dll(lib, "CAST_FIND_SLACK").value
    idx = np.empty(limit + slack, dtype=np.int64)
    fresh, stale = np.empty(limit + slack, dtype=out.dtype), np.empty(limit + slack, dtype=out.dtype)
    k = lib.cast_and_find(
        *(a.ctypes.data for a in (src, old, out)), src.size, *(a.ctypes.data for a in (idx, fresh, stale)), limit
    )
    return None if k < 0 else (idx[:k], fresh[:k], stale[:k])
