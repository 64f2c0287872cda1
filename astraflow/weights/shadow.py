"""The follower's shadow: a second copy of the weights that a streamed delta is written into while
its chunks still arrive, handed out only once the version's manifest verifies.

Why: a streamed publish (``streamed.py``) sends a delta's chunks while later tensors are still
being encoded, and lists on each chunk the sections that ended in it. Applying them as they come
takes the apply off the path from the manifest to the new weights; applying them to the weights
the owner reads would show it bytes that no signature vouches for yet. So they go to a copy that
no one else holds.

What makes it safe (every step is the thread's; the owner only ever gets a finished shadow):

1. A streamed delta is written into the shadow only if its base is the follower's tip, chunk by
   chunk in index order (a chunk that comes early waits, a duplicate is ignored), each section
   checked against the tip's layout as ``check_payload`` checks it (``payload.check_tensor``); the
   bytes are hashed as they are applied.
2. Its manifest, signed when the follower verifies (``signing.py``), hands the shadow over only when
   it vouches for exactly what was written: every chunk, the sha256 of their bytes, the same tensor
   specs in the same order and the same tensor names. Otherwise (a spec the shadow cannot take in
   place, a chunk whose bytes or specs the manifest disagrees with) the shadow is dropped and the
   version is assembled and checked whole, as for a serial publish.
3. A version whose manifest never comes (a crashed or fenced trainer) or is refused leaves its
   writes in the shadow, which is dropped as soon as another version is accepted: no one reads it.

The two copies: the owner reads the state ``take`` handed out last; when ``take`` hands out a
shadow, the state it held goes back to the thread (``adopt``) and becomes the next shadow, brought
up to the tip by applying again the deltas accepted since its version (``history``). A full
version gives a fresh shadow (a copy of it) when its publisher streams. The cost is one more copy
of the model in the transfer dtype (``peak_bytes``) and the deltas since the older copy's version.
"""

from __future__ import annotations

import bisect
import hashlib

import numpy as np
import torch

from astraflow.core.errors import WeightsError
from astraflow.schemas.records import TensorSpec, WeightChunk
from astraflow.weights.delta import Section, apply_section
from astraflow.weights.payload import Layout, PlannedTensor, apply_payload, check_tensor, tensor_bits


class StreamedDelta:
    """One streamed delta, written into ``state`` (the shadow, on the tip) chunk by chunk (step 1)."""

    def __init__(self, state: dict[str, torch.Tensor], layout: Layout) -> None:
        self.state, self.layout = state, layout
        self.next_index = 0
        self.end = 0
        """Payload bytes of the chunks applied."""
        self.hasher = hashlib.sha256()
        self.starts: list[int] = []
        self.pieces: list[np.ndarray] = []
        self.specs: list[TensorSpec] = []
        self.plan: list[PlannedTensor] = []
        self._parsed: dict[tuple[int, int, str], Section] = {}
        self._done: dict[tuple[int, int, str], torch.Tensor] = {}
        self._targets: dict[int, tuple[int, int, str]] = {}
        """id of a shadow tensor → the section written into it: one tensor never takes two."""

    def advance(self, chunks: dict[int, bytes], specs: dict[int, list[TensorSpec]]) -> None:
        """Apply the chunks that follow those applied, in index order, while there are any.

        Raises ``WeightsError`` when a section does not parse, fit the tip's layout or apply in place."""
        while self.next_index in chunks:
            data = chunks[self.next_index]
            self.hasher.update(data)
            self.starts.append(self.end)
            self.pieces.append(np.frombuffer(data, dtype=np.uint8))
            self.end += len(data)
            for spec in specs.get(self.next_index, []):
                self._apply(spec)
            self.next_index += 1

    def vouched_for(self, manifest: WeightChunk) -> bool:
        """Whether ``manifest`` describes exactly what was written (step 2)."""
        return (
            self.next_index == manifest.num_chunks
            and self.end == manifest.total_bytes
            and self.hasher.hexdigest() == manifest.sha256
            and self.specs == manifest.tensors
            and self.state.keys() == {spec.name for spec in manifest.tensors}
        )

    def _apply(self, spec: TensorSpec) -> None:
        entry = check_tensor(spec, self._bytes(spec), spec.offset, self.layout, self._parsed)
        self.specs.append(spec)
        self.plan.append(entry)
        if spec.length and entry.key in self._done:  # a tied tensor, stored once
            self.state[spec.name] = self._done[entry.key]
            return
        tensor = self.state.get(spec.name)
        if (
            tensor is None
            or tensor.dtype != entry.dtype
            or tensor.numel() != entry.section.n
            or not tensor.is_contiguous()
            or self._targets.setdefault(id(tensor), entry.key) != entry.key
        ):
            raise WeightsError(f"tensor {spec.name!r}: its section cannot be written into the shadow in place")
        apply_section(entry.section, tensor_bits(tensor))
        shaped = tensor if tuple(tensor.shape) == tuple(spec.shape) else tensor.view(spec.shape)
        self.state[spec.name] = self._done[entry.key] = shaped

    def _bytes(self, spec: TensorSpec) -> np.ndarray:
        """The payload bytes of ``spec``'s section: a view when they lie in one chunk."""
        first, last = spec.offset, spec.offset + spec.length
        if first < 0 or spec.length < 0 or last > self.end:
            raise WeightsError(f"tensor {spec.name!r}: its section does not lie in the chunks before its spec")
        at = max(bisect.bisect_right(self.starts, first) - 1, 0)
        parts = []
        while at < len(self.pieces) and self.starts[at] < last:
            start = self.starts[at]
            parts.append(self.pieces[at][max(first - start, 0) : last - start])
            at += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)


class Shadow:
    """The follower thread's second copy of the weights and what brings it up to the tip."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] | None = None
        self.seq = -1
        """Accepted versions (the follower's count) that ``state`` holds."""
        self.full_seq = -1
        self.history: list[tuple[int, list[PlannedTensor]]] = []
        """(seq, plan) of the deltas accepted since the last full version."""
        self.writer: tuple | None = None
        """Key of the streamed delta written into ``state``; ``state`` is no version while set."""
        self.delta: StreamedDelta | None = None
        self.refused: tuple | None = None
        """Key of the streamed delta that last failed in the shadow: not tried again."""
        self.peak_bytes = 0

    def full(self, seq: int, plan: list[PlannedTensor], streamed: bool) -> None:
        """A full version was accepted: a copy of it is the shadow when its publisher streams, else none.
        Call before any later delta is applied to the full version's own tensors."""
        self.drop()
        self.full_seq, self.history = seq, []
        if streamed:
            copies: dict[int, torch.Tensor] = {}
            view = apply_payload(plan, None, in_place=False)
            self._hold({name: copies.setdefault(id(t), t.clone()) for name, t in view.items()}, seq)

    def accepted(self, seq: int, plan: list[PlannedTensor], oldest: int) -> None:
        """A delta was accepted; ``oldest``: the seq of the oldest copy that may come back to catch up."""
        self.history.append((seq, plan))
        keep = min(oldest, self.seq if self.state is not None else oldest)
        self.history = [(s, p) for s, p in self.history if s > keep]

    def adopt(self, state: dict[str, torch.Tensor], seq: int) -> None:
        """A state the owner let go (``take`` handed out a newer one) becomes the shadow, if none is."""
        if self.state is None and seq >= self.full_seq:
            self._hold(state, seq)

    def begin(self, key: tuple, layout: Layout, tip: int) -> StreamedDelta | None:
        """The streamed delta ``key`` on the tip (the ``tip``-th accepted version) written into the
        shadow, brought up to the tip first; ``None`` when there is no shadow or it is another's."""
        if self.writer is not None or key == self.refused:
            return self.delta if self.writer == key else None
        if self.state is None or not self._catch_up(tip):
            return None
        self.writer, self.delta = key, StreamedDelta(self.state, layout)
        return self.delta

    def hand_over(self) -> dict[str, torch.Tensor]:
        """The written shadow, for the owner (its manifest verified); the thread holds no shadow after."""
        state = self.delta.state
        self.state, self.writer, self.delta = None, None, None
        return state

    def drop(self, refuse: bool = False) -> None:
        """Forget the shadow (its writes are no version); ``refuse``: do not try its writer again."""
        if refuse:
            self.refused = self.writer
        self.state, self.writer, self.delta = None, None, None

    def _catch_up(self, tip: int) -> bool:
        """Apply the deltas accepted since the shadow's version; ``False`` (and no shadow) when it cannot be."""
        missing = [(s, p) for s, p in self.history if s > self.seq]
        fits = self.seq >= self.full_seq and self.seq + len(missing) == tip
        for _, plan in missing if fits else []:
            if not all(_in_place(entry, self.state) for entry in plan):
                fits = False
                break
            self.state = apply_payload(plan, self.state, in_place=True)
        if not fits:
            self.drop()
            return False
        self.seq = tip
        return True

    def _hold(self, state: dict[str, torch.Tensor], seq: int) -> None:
        self.state, self.seq = state, seq
        unique = {id(t): t for t in state.values()}
        self.peak_bytes = max(self.peak_bytes, sum(t.numel() * t.element_size() for t in unique.values()))


def _in_place(entry: PlannedTensor, state: dict[str, torch.Tensor]) -> bool:
    """Whether ``apply_payload`` writes this entry into ``state``'s tensor instead of viewing its payload."""
    tensor = state.get(entry.spec.name)
    return tensor is not None and tensor.dtype == entry.dtype and tensor.numel() == entry.section.n
