"""The payload of one weight version: tensor sections described by the manifest's ``TensorSpec``s.

A full version and a delta share one layout: each tensor's section (``delta.py``) starts at an
8-byte aligned ``offset`` of one buffer and takes ``length`` bytes; ``TensorSpec.encoding`` says
how to read it (``raw`` for every tensor of a full version). Floating-point tensors travel in the
transfer dtype, others (step counters, masks) as they are. Tied tensors (one storage under two
names, like a tied ``lm_head``) are written once: their specs name the same byte range, and the
reader hands out one tensor for both.

Readers get tensors in the transfer dtype. Loading bf16 weights into an fp32 model is intended:
as in the AstraFlow paper, producers and the evaluator sample with the bf16-rounded weights, and
every reader sees exactly the same values because full versions are in the transfer dtype too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import Mapping

import numpy as np
import torch

from astraflow.errors import WeightsError
from astraflow.schemas.records import TensorSpec
from astraflow.weights.delta import decode_bits, encode_bits, pad8

TRANSFER_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.bfloat16, torch.float16, torch.float32, torch.float64,
                                                      torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


@dataclass
class Payload:
    """One version's bytes, its tensor table, and per-tensor change counts (tied tensors once)."""

    buffer: bytearray
    specs: list[TensorSpec]
    changes: list[tuple[str, int, int]] = field(default_factory=list)
    """(name, elements, changed elements) of each stored tensor."""

    @property
    def elements(self) -> int:
        return sum(n for _, n, _ in self.changes)

    @property
    def changed(self) -> int:
        return sum(k for _, _, k in self.changes)


def to_transfer(state: Mapping[str, torch.Tensor], transfer_dtype: str) -> dict[str, torch.Tensor]:
    """A CPU copy of ``state`` with floating tensors in the transfer dtype; tied tensors stay tied."""
    dtype = TRANSFER_DTYPES[transfer_dtype]
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple, torch.Tensor] = {}
    for name, tensor in state.items():
        tensor = tensor.detach()
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if key not in seen:
            target = dtype if tensor.is_floating_point() else tensor.dtype
            seen[key] = tensor.to(device="cpu", dtype=target, copy=True).contiguous()  # copy: never alias the live model
        out[name] = seen[key]
    return out


def build_payload(state: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor] | None) -> Payload:
    """Encode ``state`` (transfer dtype, ``to_transfer``) as a delta against ``base``, or full when ``None``."""
    specs: list[TensorSpec] = []
    sections: list[tuple[int, tuple[np.ndarray, ...]]] = []
    changes: list[tuple[str, int, int]] = []
    written: dict[tuple[int, int], TensorSpec] = {}
    offset = 0
    for name, tensor in state.items():
        old = base.get(name) if base is not None else None
        twin = written.get((id(tensor), id(old)))
        if twin is not None:
            specs.append(replace(twin, name=name))
            continue
        old_bits = _bits(old) if old is not None and old.dtype == tensor.dtype and old.shape == tensor.shape else None
        encoded = encode_bits(_bits(tensor), old_bits)
        spec = TensorSpec(name, _dtype_name(tensor.dtype), list(tensor.shape), offset, encoded.nbytes, encoded.encoding)
        written[(id(tensor), id(old))] = spec
        specs.append(spec)
        sections.append((offset, encoded.parts))
        changes.append((name, tensor.numel(), encoded.changed))
        offset = pad8(offset + encoded.nbytes)
    buffer = bytearray(offset)
    view = np.frombuffer(buffer, dtype=np.uint8)
    for start, parts in sections:
        for part in parts:
            view[start : start + part.nbytes] = part.reshape(-1).view(np.uint8)
            start = pad8(start + part.nbytes)
    return Payload(buffer, specs, changes)


def read_payload(buffer: bytearray, specs: list[TensorSpec], base: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The state dict (transfer dtype) of a payload; ``base`` is the version a delta applies to.

    Unchanged tensors are ``base``'s own objects and raw ones view ``buffer``; never write to them.
    Raises ``WeightsError`` when a spec does not fit the buffer, its encoding or the base.
    """
    data = np.frombuffer(buffer, dtype=np.uint8)
    state: dict[str, torch.Tensor] = {}
    decoded: dict[tuple[int, int, str], torch.Tensor] = {}
    for spec in specs:
        key = (spec.offset, spec.length, spec.encoding)
        if spec.length and key in decoded:  # a tied tensor, stored once
            state[spec.name] = decoded[key]
            continue
        dtype = _DTYPES.get(spec.dtype)
        if dtype is None or spec.offset < 0 or spec.length < 0 or spec.offset + spec.length > len(buffer) or spec.offset % 8:
            raise WeightsError(f"tensor {spec.name!r}: {spec.dtype} at [{spec.offset}, +{spec.length}) does not fit a {len(buffer)}-byte payload")
        old = base.get(spec.name) if base is not None else None
        old_bits = _bits(old) if old is not None and old.dtype == dtype else None
        n = prod(spec.shape)
        try:
            bits = decode_bits(spec.encoding, data[spec.offset : spec.offset + spec.length], n, _numpy_bits(dtype), old_bits)
        except WeightsError as exc:
            raise WeightsError(f"tensor {spec.name!r}: {exc}") from exc
        tensor = old if bits is old_bits else torch.from_numpy(bits).view(dtype).reshape(spec.shape)
        state[spec.name] = decoded[key] = tensor
    return state


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """[n] integer view of a contiguous CPU tensor's bits (no copy)."""
    return tensor.reshape(-1).view(_BITS[tensor.element_size()]).numpy()


def _numpy_bits(dtype: torch.dtype) -> np.dtype:
    return np.dtype(_NUMPY_BITS[dtype.itemsize])


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise WeightsError(f"cannot publish tensors of dtype {name}; supported: {sorted(_DTYPES)}")
    return name
