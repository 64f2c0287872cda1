"""Sealed checkpoints: wherever a checkpoint's weights are loaded, they are the ones the trainer signed.

A signed manifest proves a version on the weights topic, but a checkpoint is files on a disk: edited
there, a trainer would resume from it and ``astraflow export-model`` would ship it. With
``weights.signing_key`` the trainer therefore seals every checkpoint it writes: ``seal.avro`` in the
checkpoint directory, a ``WeightChunk`` of kind ``seal`` holding the digest of the checkpoint's
weights (``state_digest``: every tensor, by name, in the transfer dtype the readers load) and signed
like a manifest, bound to the run's weights topic. With ``weights.verify_key``, resuming a trainer and
exporting a version (``export-model``, the run's final export) first check the seal: present, signed
by that key for this run and policy, of this version, and of exactly these weights; anything else is
refused with the reason (``WeightsError``).

The digest is of the weights alone, independent of how a checkpoint lays them out (whole or sharded)
or how a publish encodes them (full or delta), so the same check holds for every checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from astraflow.core.errors import SchemaError, WeightsError
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.signing import ManifestSigner, ManifestVerifier

SEAL_FILE = "seal.avro"
SEAL_KIND = "seal"


def state_digest(state: Mapping, transfer_dtype: str) -> str:
    """The sha256 of ``state``'s tensors in ``transfer_dtype`` (``to_transfer``), name by name in sorted
    order, each with its dtype and shape: the same for the same weights however they were stored."""
    import torch

    from astraflow.weights.payload import to_transfer

    transfer = to_transfer(state, transfer_dtype)
    digest = hashlib.sha256()
    for name in sorted(transfer):
        tensor = transfer[name]
        digest.update(f"{name}\0{tensor.dtype}\0{list(tensor.shape)}\0".encode())
        digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def make_seal(signer: ManifestSigner, topic: str, policy: str, version: int, digest: str) -> bytes:
    """The encoded, signed seal of ``policy``'s checkpoint of ``version`` whose weights have ``digest``."""
    seal = WeightChunk(policy, version, -1, "digest", SEAL_KIND, -1, 0, 0, digest)
    return Codec().encode(signer.sign(seal, topic))


def check_seal(directory: Path, version: int, digest: str, verifier: ManifestVerifier, topic: str) -> None:
    """Raise ``WeightsError`` unless ``directory`` holds a seal of ``version`` for ``topic``, signed by
    ``verifier``'s key, of weights with ``digest``."""
    path = directory / SEAL_FILE
    where = f"checkpoint {directory}"
    if not path.is_file():
        raise WeightsError(
            f"{where} has no {SEAL_FILE}: weights.verify_key accepts only checkpoints sealed by the trainer's "
            "weights.signing_key (written before signing was configured, or its seal was removed)"
        )
    try:
        seal = Codec().decode(path.read_bytes(), expect=WeightChunk)
    except SchemaError as exc:
        raise WeightsError(f"{where}: {SEAL_FILE} is not a seal: {exc}") from exc
    if seal.kind != SEAL_KIND:
        raise WeightsError(f"{where}: {SEAL_FILE} holds a {seal.kind!r} record, not a seal")
    refusal = verifier.refusal(seal, topic)
    if refusal is not None:
        raise WeightsError(f"{where}: its seal is refused: {refusal}")
    if seal.version != version:
        raise WeightsError(f"{where}: its seal is of version {seal.version}, not of version {version}")
    if seal.sha256 != digest:
        raise WeightsError(
            f"{where}: its weights are not the ones the trainer sealed (digest {digest[:16]}..., sealed "
            f"{seal.sha256[:16]}...): changed on disk; refusing to load them"
        )
