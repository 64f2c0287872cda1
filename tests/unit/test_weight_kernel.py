"""The C kernel of a bf16 delta (``weights/kernel.py``): torch's cast bit for bit, numpy's changes exactly."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.weights import kernel
from astraflow.weights.delta import _changed_sparsely, encode_bits

SPECIALS = [
    float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
    1e-45, -1e-45, 1e-39, 3.4e38, -3.4e38, 3.3961776e38,  # denormals; the largest floats (and one rounding to inf)
    1.00390625, 1.01171875, 1.0039063, -1.00390625,  # ties to even (down, up), just past a tie, negative tie
]  # fmt: skip


def bits(tensor: torch.Tensor) -> np.ndarray:
    return tensor.view(torch.int16).numpy()


@pytest.fixture(scope="module")
def compiled() -> None:
    if kernel.library() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the weights kernel did not build: the README's test command installs a C compiler")
        pytest.skip("no C compiler")


@pytest.mark.parametrize("n", [0, 1, 5, 4096, 4099, 100_003])
def test_the_cast_is_torchs_and_the_changes_are_numpys(compiled: None, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    src = torch.randn(n, generator=g) * 0.02
    src[: len(SPECIALS)] = torch.tensor(SPECIALS[:n])
    src.view(torch.int32)[len(SPECIALS) : len(SPECIALS) + 2] = torch.tensor([0x7FC0_1234, -0x0000_0001])[
        : max(0, n - 16)
    ]
    old = bits((src + torch.randn(n, generator=g) * 1e-5 * (torch.rand(n, generator=g) < 0.05)).to(torch.bfloat16))
    out = np.empty(n, dtype=np.int16)
    found = kernel.cast_and_find(src.numpy(), old.copy(), out, limit=n)
    expected = bits(src.to(torch.bfloat16))
    assert np.array_equal(out, expected)
    idx = np.flatnonzero(expected != old)
    assert found is not None and np.array_equal(found[0], idx)
    assert np.array_equal(found[1], expected[idx]) and np.array_equal(found[2], old[idx])


def test_past_the_limit_it_says_so_and_still_casts_every_element(compiled: None) -> None:
    src = torch.randn(50_000)
    out = np.empty(50_000, dtype=np.int16)
    assert kernel.cast_and_find(src.numpy(), np.zeros(50_000, dtype=np.int16), out, limit=50_000 // 8) is None
    assert np.array_equal(out, bits(src.to(torch.bfloat16)))
    assert _changed_sparsely(out, np.zeros(50_000, dtype=np.int16)) is None  # numpy's search gives up alike


def test_a_section_from_the_kernels_changes_is_numpys_byte_for_byte(compiled: None) -> None:
    src = torch.randn(300_000) * 0.02
    old = bits((src * (1 + 0.01 * (torch.rand(300_000) < 0.04))).to(torch.bfloat16)).copy()
    out = np.empty(300_000, dtype=np.int16)
    found = kernel.cast_and_find(src.numpy(), old, out, limit=300_000 // 8)
    for entropy in (False, True):
        fused, plain = encode_bits(out, old, entropy, found), encode_bits(bits(src.to(torch.bfloat16)), old, entropy)
        assert fused.encoding == plain.encoding and fused.changed == plain.changed
        assert b"".join(p.tobytes() for p in fused.parts) == b"".join(p.tobytes() for p in plain.parts)


def test_without_a_compiler_it_warns_once_and_returns_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path))
    monkeypatch.setattr(kernel, "compiler", lambda: None)
    kernel.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=kernel.__name__):
            assert kernel.library() is None and kernel.library() is None
        assert [r.getMessage() for r in caplog.records if "no C compiler" in r.getMessage()] != []
        assert len(caplog.records) == 1
    finally:
        kernel.library.cache_clear()


def test_a_compiler_that_fails_leaves_no_library_and_warns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path))
    monkeypatch.setattr(kernel, "compiler", lambda: "false")  # exits 1 as a failed compile does
    kernel.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=kernel.__name__):
            assert kernel.library() is None
        assert "failed" in caplog.text and not list((tmp_path / "kernels").glob("*.so"))
    finally:
        kernel.library.cache_clear()
