"""Follow a policy's weights topic in the background and hand out the newest complete version.

``WeightFollower`` runs one thread with its own consumer (no group: every follower sees every
version). With ``payload=False`` it reads only the manifest partition, which is all that the
feeder and the staleness filter need to know the trainer's version. With ``payload=True`` it also
reads the chunks (or, for a manifest with a ``store_uri``, fetches them from the store), assembles
a version once its manifest and every chunk are in hand (chunks are grouped by version *and*
sha256, since a restarted trainer may republish a version with other bytes), verifies the sha256
and checks every tensor section against the layout it applies to. A version that is missing,
fails its checksum or is malformed is logged, counted (``corrupt_versions``) and skipped, never
applied.

Deltas: the follower applies a delta only on exactly its base (``base_version`` and
``base_sha256``), i.e. when the last version it accepted is that base. A delta whose base it does
not hold (it missed a version, rejected a corrupt one, or found its stored chunks deleted) is
logged, counted (``skipped_deltas``) and skipped; the follower keeps its version until the next
full one, which the trainer sends at least every ``weights.full_sync_interval`` versions (and
retention never cuts the log below one). Versions are taken in log order, not by number: a
trainer restarted from a checkpoint republishes the versions after it, starting with a full one,
and that lineage replaces what the follower held even where its numbers are not higher.

Where the work happens: the thread fetches, verifies and checks; the owner's ``take`` applies the
accepted versions, in order, *in place* into the tensors it handed out last (a full version's
tensors view its payload, so nothing is copied). Applying a delta then costs the changed elements
only, and the tensors are never written while the owner reads them: the owner holds them until
its next ``take``, and copies what it keeps (``load_state_dict`` does).

Where it starts: at the newest full version on the topic, or with ``payload=False`` at the newest
manifest (``start.py``). The versions before it are superseded: none of their chunks is read.

Failure: a record that cannot be used is skipped (above); anything else that goes wrong in the
thread (the log failing a poll, memory, a bug) ends the thread, and from then on every owner-facing
entry point (``latest_version``, ``newest_version``, ``take``, ``wait_for``, ``wait_caught_up``)
raises ``WeightFollowerError`` naming the topic and the cause. The owner's loop, which reads one of
them at every step, so fails with its component process, and the launcher restarts it with a new
follower, instead of the owner going on with weights, or a version, frozen for ever.

Signed versions: given a ``verifier`` (``weights.verify_key``; ``signing.py``), a manifest not signed
by its key is refused before anything else: counted (``refused_versions``), logged and, given
``dead_letters``, written to that topic with the reason. A refused version is never announced (not
in ``newest_version``), and a follower never starts at a refused full version.

Old records: the codec finds writer schemas through the log's schema topic, so the records an older
AstraFlow wrote (without ``chunk_offset``, say) are still read.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass

from astraflow.core.errors import WeightFollowerError, WeightsError
from astraflow.log import Log, Message, TopicPartition
from astraflow.runtime.context import ComponentContext, dead_letter_record
from astraflow.runtime.schema_store import LogSchemaStore
from astraflow.runtime.topics import WEIGHTS_MANIFEST_PARTITION
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.shadow import Shadow
from astraflow.weights.signing import ManifestVerifier
from astraflow.weights.start import decode_or_skip, seek_start
from astraflow.weights.store import fetch

logger = logging.getLogger(__name__)
STALE_VERSIONS = 32
"""Parts of a version this far below one that completed are dropped: a trainer crashed while publishing
it. Parts of versions closer stay, since a restarted trainer republishes from its checkpoint (at most
``train.checkpoint_every`` versions back) and the chunk partition may be read ahead of the manifests."""


@dataclass(frozen=True)
class _Accepted:
    """A verified, checked version waiting for ``take`` to apply it."""

    version: int
    full: bool
    plan: list
    """``payload.check_payload``'s plan (views of the payload)."""
    published_ms: int
    seq: int
    """Versions accepted before it and it (this follower's count)."""
    state: dict | None = None
    """The version already applied to a shadow (``shadow.py``), for ``take`` to hand out as it is."""


class WeightFollower:
    """Tracks the newest version on a weights topic; with ``payload`` also its state dict."""

    def __init__(
        self,
        log: Log,
        topic: str,
        payload: bool,
        poll_timeout: float = 0.2,
        verifier: ManifestVerifier | None = None,
        dead_letters: str | None = None,
        origin: str = "weights-follower",
    ) -> None:
        self.topic = topic
        self.payload = payload
        self._latest_version = -1
        self.latest_published_ms = 0
        self._newest_version = -1
        self.taken_published_ms = 0
        """Publish time of the version ``take`` returned last (for publish → applied latency)."""
        self.skipped_deltas = 0
        self.corrupt_versions = 0
        self.refused_versions = 0
        self.applied_ahead = 0
        """Versions written into the shadow while their chunks arrived (``shadow.py``), not applied by ``take``."""
        """Manifests refused by ``verifier``: unsigned, signed by another key, or changed after signing."""
        self._verifier = verifier
        self._dead_letters = dead_letters
        self._origin = origin
        self._log = log
        self._dead_letter_producer = None
        self._schemas = LogSchemaStore(log)
        self._codec = Codec(self._schemas)
        self._consumer = log.consumer(group_id=None)
        self._manifest_tp = TopicPartition(topic, WEIGHTS_MANIFEST_PARTITION)
        self._catch_up_to = log.end_offsets(topic).get(WEIGHTS_MANIFEST_PARTITION, 0)
        self._newest_rejected = -1
        self._caught_up = False
        self._failure: BaseException | None = None
        """What ended the thread, if anything did; the owner-facing entry points raise it."""
        self._chunks: dict[tuple[int, str], dict[int, bytes]] = defaultdict(dict)
        self._chunk_specs: dict[tuple[int, str], dict[int, list]] = defaultdict(dict)  # of streamed publishes
        self._bases: dict[tuple[int, str], tuple[int, str]] = {}  # (version, sha256) each streamed delta is on
        self._shadow = Shadow()
        self._seq = -1  # versions accepted (the thread's count)
        self._released: tuple[dict, int] | None = None
        """A state ``take`` let go, and its seq, for the thread to make its shadow (under the lock)."""
        self._taken_seq = -1
        """Seq of the state ``take`` handed out last (written under the lock)."""
        self._state_seq = -1
        self._manifests: dict[tuple[int, str], WeightChunk] = {}
        self._tip: tuple[int, str] | None = None
        """(version, sha256) of the last version accepted: what the next delta must apply to."""
        self._tip_layout: dict | None = None
        self._accepted: list[_Accepted] = []
        """Accepted versions not taken yet: a full one first (if any), then deltas, each on the one before."""
        self._state: dict | None = None
        """The state dict ``take`` handed out last (the owner's thread only)."""
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._poll_timeout = poll_timeout
        self._thread = threading.Thread(target=self._run, name=f"weights-{topic}", daemon=True)

    def start(self) -> "WeightFollower":
        self._thread.start()
        return self

    @property
    def latest_version(self) -> int:
        """Newest version taken in (accepted, or with ``payload=False`` announced)."""
        self._raise_if_failed()
        return self._latest_version

    @property
    def newest_version(self) -> int:
        """Newest version announced by a manifest, applicable or not."""
        self._raise_if_failed()
        return self._newest_version

    def take(self) -> tuple[int, dict] | None:
        """The newest accepted (version, state dict) not taken yet, or ``None``. Call from one thread.

        The tensors belong to the follower: the next ``take`` writes the next version into them.
        """
        with self._lock:
            self._raise_if_failed()
            accepted, self._accepted = self._accepted, []
        if not accepted:
            return None
        from astraflow.weights.payload import apply_payload

        state, released = self._state, None
        for version in accepted:
            if version.state is not None:  # applied to a shadow already: ours goes back to the thread
                released, state = (state, self._state_seq) if state is not None else None, version.state
            else:
                state = apply_payload(version.plan, None if version.full else state, in_place=True)
        self._state, self._state_seq = state, accepted[-1].seq
        with self._lock:
            self._taken_seq = self._state_seq
            if released is not None:
                self._released = released
        self.taken_published_ms = accepted[-1].published_ms
        return accepted[-1].version, state

    def wait_for(self, version: int, timeout: float) -> bool:
        """Block until a version >= ``version`` is known, or ``timeout`` seconds pass."""
        with self._lock:
            reached = self._lock.wait_for(lambda: self._latest_version >= version or self._failure is not None, timeout)
            self._raise_if_failed()
            return reached

    def wait_caught_up(self, timeout: float) -> bool:
        """Block until every version published before this follower started has been taken in (or
        rejected), or ``timeout`` seconds pass. Versions before the one it started at are superseded."""
        with self._lock:
            caught_up = self._lock.wait_for(lambda: self._caught_up or self._failure is not None, timeout)
            self._raise_if_failed()
            return caught_up

    @property
    def shadow_bytes(self) -> int:
        """Most bytes the shadow (a second copy of the weights, ``shadow.py``) has held."""
        return self._shadow.peak_bytes

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()
        if self._dead_letter_producer is not None:
            self._dead_letter_producer.close()
        self._schemas.close()

    def _raise_if_failed(self) -> None:
        failure = self._failure
        if failure is not None:
            raise WeightFollowerError(
                f"the follower of weights topic {self.topic} stopped on {type(failure).__name__}: {failure}"
            ) from failure

    def _run(self) -> None:
        try:
            verifier = self._verifier
            seek_start(
                self._consumer,
                self.topic,
                self.payload,
                self._catch_up_to,
                self._codec,
                self._poll_timeout,
                self._stop,
                accept=lambda manifest: verifier is None or verifier.refusal(manifest, self.topic) is None,
            )
            while not self._stop.is_set():
                for message in self._consumer.poll(max_records=64, timeout=self._poll_timeout):
                    record = decode_or_skip(self._codec, message)
                    if record is not None:
                        self._receive(record, message)
                if not self._caught_up and self._consumer.position(self._manifest_tp) >= self._catch_up_to:
                    if max(self._latest_version, self._newest_rejected) >= self._newest_version:
                        with self._lock:
                            self._caught_up = True
                            self._lock.notify_all()
        except BaseException as exc:  # noqa: BLE001 - whatever ends the thread must reach the owner, not vanish with it
            logger.error("the follower of weights topic %s stopped", self.topic, exc_info=exc)
            with self._lock:
                self._failure = exc
                self._lock.notify_all()

    def _receive(self, record: WeightChunk, message: Message) -> None:
        if record.kind == "manifest" and self._verifier is not None:
            reason = self._verifier.refusal(record, self.topic)
            if reason is not None:
                self._refuse(message, reason)
                return
        if record.kind == "manifest":
            self._newest_version = max(self._newest_version, record.version)
        if not self.payload:
            if record.kind == "manifest" and record.version > self._latest_version:
                self._set_latest(record.version, record.created_ms, None)
            return
        key = (record.version, record.publish_id or record.sha256)  # a restarted trainer republishes versions
        if record.kind == "chunk":
            self._chunks[key].setdefault(record.chunk_index, record.data)
            if record.publish_id:
                self._chunk_specs[key].setdefault(record.chunk_index, record.tensors)
                if record.encoding == "delta":
                    self._bases[key] = (record.base_version, record.base_sha256)
                    self._stream(key)
        else:
            self._manifests[key] = record
        manifest = self._manifests.get(key)
        if manifest is None:
            return
        pieces = self._chunks.get(key, {})
        if manifest.store_uri is None and any(i not in pieces for i in range(manifest.num_chunks)):
            return
        del self._manifests[key]
        self._chunks.pop(key, None)
        self._chunk_specs.pop(key, None)
        self._bases.pop(key, None)
        for parts in (self._chunks, self._manifests, self._chunk_specs, self._bases):
            for stale in [k for k in parts if k[0] < record.version - STALE_VERSIONS]:
                del parts[stale]
        self._take_in(manifest, pieces, key)
        for waiting in [k for k, base in self._bases.items() if base == self._tip]:  # on the new tip
            self._stream(waiting)

    def _stream(self, key: tuple[int, str]) -> None:
        """Write the chunks in of the streamed delta ``key`` into the shadow, if it is on the tip and
        the shadow is free or already its own (``shadow.py``, step 1)."""
        if self._bases.get(key) != self._tip:
            return
        self._adopt_released()
        delta = self._shadow.begin(key, self._tip_layout, self._seq)
        if delta is None:
            return
        try:
            delta.advance(self._chunks[key], self._chunk_specs[key])
        except WeightsError as exc:
            logger.info("weights version %d of %s: applied whole, not as it arrives: %s", key[0], self.topic, exc)
            self._shadow.drop(refuse=True)

    def _refuse(self, message: Message, reason: str) -> None:
        """Count, log and dead-letter a manifest the verifier refused; its version is never announced."""
        self.refused_versions += 1
        logger.error("weights topic %s: refused a manifest at offset %d: %s", self.topic, message.offset, reason)
        if self._dead_letters is None:
            return
        if self._dead_letter_producer is None:
            self._dead_letter_producer = self._log.producer()
        record = dead_letter_record(self._origin, message, reason, WeightsError(reason))
        self._dead_letter_producer.send(self._dead_letters, self._codec.encode(record))
        self._dead_letter_producer.flush()

    def _adopt_released(self) -> None:
        """The state ``take`` let go, if any, becomes the shadow (or is dropped)."""
        with self._lock:
            released, self._released = self._released, None
        if released is not None:
            self._shadow.adopt(*released)

    def _take_in(self, manifest: WeightChunk, pieces: dict[int, bytes], key: tuple[int, str]) -> None:
        """Verify and check one complete version and queue it for ``take``, or count and log why not."""
        from astraflow.weights.payload import check_payload, spec_layout

        delta = manifest.encoding == "delta"
        if delta and self._tip != (manifest.base_version, manifest.base_sha256):
            self.skipped_deltas += 1
            self._newest_rejected = max(self._newest_rejected, manifest.version)
            logger.warning(
                "weights version %d of %s is a delta on version %d, but this reader holds %s; "
                "waiting for the next full version",
                manifest.version,
                self.topic,
                manifest.base_version,
                self._tip[0] if self._tip else "none",
            )
            return
        shadow = self._shadow
        written = shadow.writer == key
        if written and shadow.delta.vouched_for(manifest):  # shadow.py, step 2
            plan, state = shadow.delta.plan, shadow.hand_over()
            self.applied_ahead += 1
        else:
            state = None
            if shadow.writer is not None:  # no version (step 3)
                shadow.drop()
            try:
                if manifest.encoding not in ("full", "delta"):
                    raise WeightsError(f"unknown version encoding {manifest.encoding!r}")
                plan = check_payload(fetch(manifest, pieces), manifest.tensors, self._tip_layout if delta else None)
            except WeightsError as exc:
                self.corrupt_versions += 1
                self._newest_rejected = max(self._newest_rejected, manifest.version)
                logger.error("weights version %d of %s not applied: %s", manifest.version, self.topic, exc)
                return
        self._seq += 1
        self._tip, self._tip_layout = (manifest.version, manifest.sha256), spec_layout(manifest.tensors)
        accepted = _Accepted(manifest.version, not delta, plan, manifest.created_ms, self._seq, state)
        self._set_latest(manifest.version, manifest.created_ms, accepted)
        self._adopt_released()  # before trimming the deltas it may need
        with self._lock:
            oldest = self._taken_seq
        if delta:
            shadow.accepted(self._seq, plan, oldest)
        else:  # before any later delta is applied to this version's own tensors: none is accepted yet
            shadow.full(self._seq, plan, streamed=bool(manifest.publish_id))

    def _set_latest(self, version: int, published_ms: int, accepted: _Accepted | None) -> None:
        with self._lock:
            self._latest_version = max(self._latest_version, version)
            self.latest_published_ms = published_ms
            if accepted is not None:
                replaces = accepted.full or accepted.state is not None  # holds every version before it
                self._accepted = [accepted] if replaces else [*self._accepted, accepted]
            self._lock.notify_all()


def follow_weights(ctx: ComponentContext, policy: str, payload: bool) -> WeightFollower:
    """A started follower of ``policy``'s weights for a component of the run: with
    ``weights.verify_key`` it takes in only versions signed by that key and dead-letters the rest."""
    key = ctx.config.weights.verify_key
    verifier = ManifestVerifier(key) if key else None
    follower = WeightFollower(
        ctx.log,
        ctx.topics.weights(policy),
        payload,
        verifier=verifier,
        dead_letters=ctx.topics.deadletter(ctx.role),
        origin=ctx.instance,
    )
    return follower.start()
