"""Signed weight versions: the trainer signs each manifest with Ed25519, followers check the signature.

A manifest's ``sha256`` proves that the chunks are the bytes the manifest describes, not who wrote
the manifest: anyone who may write the weights topic could push a version of their own to every
rollout producer and evaluator. With ``weights.signing_key`` (the trainer's private key) and
``weights.verify_key`` (the matching public key, all that the readers hold), the trainer signs
every manifest and every follower takes in only versions signed by that key. The signature covers
every field of the manifest a reader acts on (policy, version, base version and base sha256,
encoding, payload size and sha256, chunk count, tensor table, store URI, chunk offset, time, and the
id of a streamed publish), the weights topic it is published on (``{run}.weights.{policy}``: so one
copied to another run's or another policy's topic does not verify there), and through the payload's
sha256 every byte of the chunks, so a chunk or a field changed in transit fails as surely as a
version from another key. A streamed publish's chunks list specs of their own (``streamed.py``); a
follower shows what it applied from them only once the signed manifest lists the same (``shadow.py``).
Checkpoints are sealed the same way (``seal.py``).

A follower refuses three kinds of manifest, logs it, counts it (``WeightFollower.refused_versions``)
and writes it to the run's dead-letter topic with the reason: ``unsigned`` (no signature),
``foreign`` (signed by another key, named by its fingerprint) and ``bad signature`` (the
configured key's fingerprint, but the bytes do not verify: changed after signing, or signed for
another topic).

What it does not cover: a genuine manifest written again later (a replay) still verifies; the
topic's write ACLs (``astraflow broker start --secure``) keep everyone but the trainer from
writing it. ``astraflow keys generate`` makes a key pair.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

from astraflow.core.errors import ConfigError, WeightsError
from astraflow.schemas.records import WeightChunk

DOMAIN = b"astraflow.weights.manifest.v2\x00"
"""Prefix of every signed message, so a signature over a manifest means nothing elsewhere (v2: with its
topic; a v1 signature, over no topic, does not verify)."""


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ConfigError(
            "signed weights need the 'cryptography' package: reinstall AstraFlow (scripts/setup.sh)"
        ) from exc
    return InvalidSignature, serialization, ed25519


def signed_message(manifest: WeightChunk, topic: str) -> bytes:
    """The bytes a manifest's signature is over: every field but the data, signature and signer, and
    the weights topic it is for."""
    fields = {
        "topic": topic,
        "policy": manifest.policy,
        "version": manifest.version,
        "base_version": manifest.base_version,
        "base_sha256": manifest.base_sha256,
        "encoding": manifest.encoding,
        "kind": manifest.kind,
        "num_chunks": manifest.num_chunks,
        "total_bytes": manifest.total_bytes,
        "sha256": manifest.sha256,
        "tensors": [[t.name, t.dtype, list(t.shape), t.offset, t.length, t.encoding] for t in manifest.tensors],
        "store_uri": manifest.store_uri,
        "chunk_offset": manifest.chunk_offset,
        "created_ms": manifest.created_ms,
    }
    if manifest.publish_id:  # only when set: a manifest signed before the field existed still verifies
        fields["publish_id"] = manifest.publish_id
    return DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def fingerprint(public_raw: bytes) -> str:
    """Short name of a public key: the first 16 hex digits of the sha256 of its raw 32 bytes."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _public_raw(public_key) -> bytes:
    _, serialization, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class ManifestSigner:
    """Signs manifests with the Ed25519 private key in a PEM (PKCS#8) file, readable by its owner only."""

    def __init__(self, path: str | Path) -> None:
        _, serialization, ed25519 = _crypto()
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"weights.signing_key: {path} is not a file (make a key pair with: astraflow keys generate)"
            )
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"weights.signing_key: {path} can be read by other users (mode {stat.S_IMODE(mode):o}); "
                f"make it private with: chmod 600 {path}"
            )
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"weights.signing_key: {path} is not an unencrypted PEM private key: {exc}") from exc
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise ConfigError(f"weights.signing_key: {path} holds a {type(key).__name__}, not an Ed25519 key")
        self._key = key
        self.fingerprint = fingerprint(_public_raw(key.public_key()))

    def sign(self, manifest: WeightChunk, topic: str) -> WeightChunk:
        """``manifest``, for the weights topic ``topic``, with its signature and the signer's fingerprint set."""
        unsigned = replace(manifest, signature=b"", signer=self.fingerprint)
        return replace(unsigned, signature=self._key.sign(signed_message(unsigned, topic)))


class ManifestVerifier:
    """Checks manifests against the Ed25519 public key in a PEM file."""

    def __init__(self, path: str | Path) -> None:
        _, serialization, ed25519 = _crypto()
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"weights.verify_key: {path} is not a file (make a key pair with: astraflow keys generate)"
            )
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"weights.verify_key: {path} is not a PEM public key: {exc}") from exc
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise ConfigError(f"weights.verify_key: {path} holds a {type(key).__name__}, not an Ed25519 key")
        self._key = key
        self.fingerprint = fingerprint(_public_raw(key))

    def refusal(self, manifest: WeightChunk, topic: str) -> str | None:
        """Why ``manifest``, read as one for the weights topic ``topic``, must not be taken in (unsigned,
        foreign, bad signature), or ``None``."""
        invalid_signature, _, _ = _crypto()
        what = f"weights version {manifest.version} of policy {manifest.policy!r}"
        if not manifest.signature:
            return (
                f"unsigned: {what} carries no signature, and readers accept only versions signed by {self.fingerprint}"
            )
        if manifest.signer != self.fingerprint:
            return f"foreign: {what} is signed by key {manifest.signer or '?'}, not by {self.fingerprint}"
        try:
            self._key.verify(manifest.signature, signed_message(manifest, topic))
        except invalid_signature:
            return (
                f"bad signature: {what} does not verify against key {self.fingerprint} for {topic}"
                " (changed after signing, or signed for another run's or policy's topic)"
            )
        return None

    def check(self, manifest: WeightChunk, topic: str) -> None:
        """Raise ``WeightsError`` with the refusal when ``manifest`` is not signed by this key for ``topic``."""
        reason = self.refusal(manifest, topic)
        if reason is not None:
            raise WeightsError(reason)


def generate_key_pair(directory: str | Path, name: str = "weights-signing") -> tuple[Path, Path, str]:
    """Write a new Ed25519 key pair as ``{name}.pem`` (private, mode 0600) and ``{name}.pub.pem`` in
    ``directory``; refuses to overwrite. Returns (private path, public path, fingerprint)."""
    _, serialization, ed25519 = _crypto()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    for path in (private, public):
        if path.exists():
            raise ConfigError(f"{path} exists already: not overwriting a key")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    public.write_bytes(public_pem)
    return private, public, fingerprint(_public_raw(key.public_key()))
