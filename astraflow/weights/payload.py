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

Reading is ``check_payload`` (every section parsed and checked against the layout of the base:
names, dtypes, sizes) then ``apply_payload``, which either builds new tensors or, ``in_place``,
writes the changes into the base's own tensors: a follower then touches only the changed
elements instead of copying the whole model per version. A check that fails leaves the base as
it was.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from math import prod
from typing import Mapping

import numpy as np
import torch

from astraflow.core.errors import WeightsError
from astraflow.schemas.records import TensorSpec
from astraflow.weights.delta import Section, apply_section, decode_section, encode_bits, pad8, parse_section

TRANSFER_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


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


def to_transfer(
    state: Mapping[str, torch.Tensor], transfer_dtype: str, reuse: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """A CPU copy of ``state`` with floating tensors in the transfer dtype; tied tensors stay tied.

    ``state`` may make its tensors as it is read and drop each after (a sharded model's gathered
    weights, ``FsdpBackend.full_state``): a tensor at the address of one freed before is not tied to it.

    ``reuse``: an earlier result whose tensors nobody reads any more; those of matching name,
    dtype and shape are overwritten instead of allocated (a fresh gigabyte costs its page faults,
    several times the copy itself).
    """
    dtype = TRANSFER_DTYPES[transfer_dtype]
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple, tuple[weakref.ref, torch.Tensor]] = {}
    taken: set[int] = set()
    for name, given in state.items():
        tensor = given.detach()
        key = tie_key(tensor)
        source, copied = seen.get(key, (None, None))
        if source is None or source() is None:  # new, or at the address of a tensor freed since (not tied)
            target = dtype if tensor.is_floating_point() else tensor.dtype
            spare = reuse.get(name) if reuse is not None else None
            if spare is not None and spare.dtype == target and spare.shape == tensor.shape and id(spare) not in taken:
                copied = spare.copy_(tensor)
            else:
                copied = tensor.to(device="cpu", dtype=target, copy=True).contiguous()  # copy: never alias the model
            seen[key] = (weakref.ref(given), copied)  # alive as long as ``state`` or its reader keeps it
            taken.add(id(copied))
        out[name] = copied
    return out


def tie_key(tensor: torch.Tensor) -> tuple:
    """What two tensors of a state dict share when one is tied to the other (the same weights under two
    names): storage, offset, shape, stride and dtype."""
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.dtype,
    )


def build_payload(
    state: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor] | None, entropy: bool = True
) -> Payload:
    """Encode ``state`` (transfer dtype, ``to_transfer``) as a delta against ``base``, or full when ``None``;
    ``entropy``: Huffman-code long streams (``delta.encode_bits``)."""
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
        usable = old is not None and old.dtype == tensor.dtype and old.shape == tensor.shape
        encoded = encode_bits(tensor_bits(tensor), tensor_bits(old) if usable else None, entropy)
        spec = TensorSpec(name, dtype_name(tensor.dtype), list(tensor.shape), offset, encoded.nbytes, encoded.encoding)
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


Layout = Mapping[str, tuple[torch.dtype, int]]
"""Name → (dtype, elements) of a state dict: what a delta's sections must fit."""


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of a checked payload: its spec, dtype and parsed section (tied ones share it)."""

    spec: TensorSpec
    dtype: torch.dtype
    section: Section
    key: tuple[int, int, str]
    """(offset, length, encoding): tied tensors, stored once, share it."""


def spec_layout(specs: list[TensorSpec]) -> dict[str, tuple[torch.dtype, int]]:
    """The layout a version has once read (the same for a full version and a delta)."""
    return {spec.name: (_DTYPES[spec.dtype], prod(spec.shape)) for spec in specs if spec.dtype in _DTYPES}


def state_layout(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.dtype, int]]:
    return {name: (tensor.dtype, tensor.numel()) for name, tensor in state.items()}


def check_payload(buffer: bytearray, specs: list[TensorSpec], base: Layout | None) -> list[PlannedTensor]:
    """Parse every section of a payload and check it against the base's layout; nothing is written.

    Raises ``WeightsError`` when a spec does not fit the buffer, its encoding or the base.
    """
    data = np.frombuffer(buffer, dtype=np.uint8)
    parsed: dict[tuple[int, int, str], Section] = {}
    return [check_tensor(spec, data, 0, base, parsed) for spec in specs]


def check_tensor(
    spec: TensorSpec, data: np.ndarray, start: int, base: Layout | None, parsed: dict[tuple[int, int, str], Section]
) -> PlannedTensor:
    """Parse one spec's section out of ``data`` (uint8: the payload's bytes from ``start`` on) and check
    it against the base's layout; ``parsed`` holds the sections parsed before (tied tensors share one).

    Raises ``WeightsError`` when the spec does not fit ``data``, its encoding or the base.
    """
    key = (spec.offset, spec.length, spec.encoding)
    dtype = _DTYPES.get(spec.dtype)
    end = start + data.size
    if dtype is None or spec.offset < start or spec.length < 0 or spec.offset + spec.length > end or spec.offset % 8:
        raise WeightsError(
            f"tensor {spec.name!r}: {spec.dtype} at [{spec.offset}, +{spec.length}) "
            f"does not fit a {end}-byte payload" + (f" from byte {start}" if start else "")
        )
    n = prod(spec.shape)
    section = parsed.get(key) if spec.length else None
    if section is None:
        at = spec.offset - start
        try:
            section = parse_section(spec.encoding, data[at : at + spec.length], n, _numpy_bits(dtype))
        except WeightsError as exc:
            raise WeightsError(f"tensor {spec.name!r}: {exc}") from exc
        parsed[key] = section
    elif section.n != n:
        raise WeightsError(f"tensor {spec.name!r}: shares the bytes of a tensor of {section.n} elements but has {n}")
    if section.needs_base and (base is None or base.get(spec.name) != (dtype, n)):
        have = base.get(spec.name) if base is not None else None
        raise WeightsError(
            f"tensor {spec.name!r}: a {spec.encoding} delta needs a base of {n} {spec.dtype} elements, "
            f"the base has {have}"
        )
    return PlannedTensor(spec, dtype, section, key)


def apply_payload(
    plan: list[PlannedTensor], base: Mapping[str, torch.Tensor] | None, in_place: bool
) -> dict[str, torch.Tensor]:
    """The state dict (transfer dtype) of a checked payload on ``base`` (``check_payload``'s layout).

    Out of place, unchanged tensors are ``base``'s own objects, raw ones view the payload and the
    others are new. ``in_place`` writes every change into ``base``'s tensors (which the result then
    shares); a base tensor that several stored tensors start from (tied in the base, untied now) is
    copied first for all but one of them.
    """
    starts = _in_place_targets(plan, base) if in_place else {}
    state: dict[str, torch.Tensor] = {}
    done: dict[tuple[int, int, str], torch.Tensor] = {}
    for entry in plan:
        spec, section = entry.spec, entry.section
        if spec.length and entry.key in done:  # a tied tensor, stored once
            state[spec.name] = done[entry.key]
            continue
        old = starts.get(spec.name) if in_place else (base.get(spec.name) if base is not None else None)
        usable = old is not None and old.dtype == entry.dtype and old.numel() == section.n
        if in_place and usable:
            apply_section(section, tensor_bits(old))
            tensor = old if tuple(old.shape) == tuple(spec.shape) else old.view(spec.shape)
        else:
            bits = decode_section(section, tensor_bits(old) if usable else None)
            tensor = (
                old
                if usable and section.encoding == "none"
                else torch.from_numpy(bits).view(entry.dtype).reshape(spec.shape)
            )
        state[spec.name] = done[entry.key] = tensor
    return state


def read_payload(
    buffer: bytearray, specs: list[TensorSpec], base: Mapping[str, torch.Tensor] | None, in_place: bool = False
) -> dict[str, torch.Tensor]:
    """``check_payload`` then ``apply_payload``: the state dict of a payload on ``base``."""
    return apply_payload(check_payload(buffer, specs, state_layout(base) if base is not None else None), base, in_place)


def _in_place_targets(plan: list[PlannedTensor], base: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The base tensor each stored tensor starts from; one base tensor is never written for two."""
    targets: dict[str, torch.Tensor] = {}
    owner: dict[int, tuple[int, int, str]] = {}
    for entry in plan:
        old = base.get(entry.spec.name) if base is not None else None
        if old is None:
            continue
        first = owner.setdefault(id(old), entry.key)
        targets[entry.spec.name] = (
            old if first == entry.key and old.is_contiguous() else old.clone(memory_format=torch.contiguous_format)
        )
    return targets


def tensor_bits(tensor: torch.Tensor) -> np.ndarray:
    """[n] integer view of a contiguous CPU tensor's bits (no copy)."""
    return tensor.reshape(-1).view(_BITS[tensor.element_size()]).numpy()


def _numpy_bits(dtype: torch.dtype) -> np.dtype:
    return np.dtype(_NUMPY_BITS[dtype.itemsize])


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise WeightsError(f"cannot publish tensors of dtype {name}; supported: {sorted(_DTYPES)}")
    return name
