"""The ``weights`` section: how trained weights travel on the weights topic."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from astraflow.config.base import Section


class WeightsConfig(Section):
    transfer_dtype: Literal["bf16", "fp32"] = "bf16"
    """Element type of floating-point weights on the weights topic; every reader loads exactly these values."""
    encoding: Literal["delta", "full"] = "delta"
    """``delta``: sparse deltas of the changed elements against the previous version; ``full``: every version whole."""
    full_sync_interval: int = Field(default=10, ge=1)
    (
        "With ``delta``: publish a full version at least every this many versions (and the first one), so readers that "
        "missed a delta resync."
    )
    chunk_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=32 * 1024 * 1024)
    (
        "Payload bytes per chunk (record or stored file); the weights topic's ``max.message.bytes`` is created to fit, "
        "at most 32 MiB (Kafka clients take records up to 64 MiB)."
    )
    encode_workers: int | None = Field(default=None, ge=0)
    (
        "Threads that encode a version's tensors while its first chunks are already sent (a streamed publish, "
        "``weights/streamed.py``; ``transport: inline`` only); unset: one per CPU core; ``0``: the serial publish "
        "(encode every tensor, then hash and send)."
    )
    entropy_coding: bool = True
    (
        "Huffman-code a delta's long position streams and 4-bit differences where that makes the tensor's section "
        "smaller (``+z`` sections, ``weights/delta.py``): ~30% fewer bytes a delta, at the cost of zlib's Huffman "
        "coder on the trainer and on every reader."
    )
    compiled_encode: bool = True
    (
        "With a streamed publish: cast float32 weights to bf16 and find a delta's changes in one pass of a small "
        "C kernel (``weights/kernel.py``, compiled once per machine with its C compiler): the same bytes as numpy's "
        "three passes, with about two thirds of their memory traffic. Without a compiler numpy's passes are used, "
        "with a warning."
    )
    transport: Literal["inline", "store"] = "inline"
    (
        "``inline``: chunks travel on the weights topic; ``store``: chunks go to ``store`` and the topic carries only "
        "manifests (claim check)."
    )
    store: str | None = Field(default=None, validate_default=True)
    (
        "With ``transport: store``: a directory or ``file://`` URI that every reader of the weights can also reach (a "
        "relative path resolves against the trainer's working directory; manifests carry the absolute URI)."
    )
    keep_versions: int | None = Field(default=8, ge=1)
    (
        "Keep only the newest this many versions (plus the full version their deltas start from): older records are "
        "deleted from the topic, older stored chunks from the store; ``None`` keeps all (the topic then grows by one "
        "version per step for the whole run)."
    )

    signing_key: str | None = None
    (
        "Path of the Ed25519 private key (PEM, mode 0600) the trainer signs every version's manifest with; made by "
        "``astraflow keys generate``. Set with ``verify_key``; only the trainer reads it."
    )
    verify_key: str | None = Field(default=None, validate_default=True)
    (
        "Path of the matching public key (PEM): rollout producers, evaluators, stream processors and the task "
        "feeder take in only versions signed by it, and refuse, count and dead-letter the rest."
    )

    @field_validator("verify_key")
    @classmethod
    def _keys_come_in_pairs(cls, verify_key: str | None, info: ValidationInfo) -> str | None:
        signing_key = info.data.get("signing_key")
        if bool(signing_key) != bool(verify_key):
            given, missing = ("signing_key", "verify_key") if signing_key else ("verify_key", "signing_key")
            raise ValueError(
                f"weights.{given} is set but weights.{missing} is not: a trainer that signs needs readers that "
                "verify, and readers that verify need a trainer that signs (astraflow keys generate makes both)"
            )
        return verify_key

    @field_validator("store")
    @classmethod
    def _store_is_reachable(cls, store: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("transport") == "store" and not store:
            raise ValueError("transport 'store' needs a directory or file:// URI for the chunks")
        if store and "://" in store and not store.startswith("file://"):
            raise ValueError(f"{store!r} is not a directory or file:// URI (no other object stores are supported)")
        return store
