"""Where a new ``WeightFollower`` starts reading a weights topic: at the newest full version.

Versions are taken in log order and a delta applies only onto its base, so the newest full
manifest supersedes everything before it: a follower that read from the beginning would fetch,
verify and apply every older version only to replace it. Before following the topic it so:

1. reads the manifest partition backwards, in windows of ``WINDOW`` manifests that double at each
   step (manifests are small, and a trainer publishes a full version at least every
   ``weights.full_sync_interval`` versions), for the last full manifest below ``end``, the
   partition's end when the follower was made;
2. starts the manifests at that one, and the chunks at its ``chunk_offset`` (the chunk partition's
   end when the publisher began sending that version), so no chunk of an older version is read;
3. without a full manifest (none published yet, or none decodable) starts both partitions at the
   beginning, and the chunks alone when the manifest has no ``chunk_offset`` (an older publisher).

A follower of the manifests only (``payload=False``) needs just the newest version: it starts
``WINDOW`` offsets before the end, so it reads the last manifest even where transaction markers
follow it (the trainer commits each manifest in a transaction, and on Kafka each commit takes an
offset). Records that retention deletes meanwhile do no harm on either backend: a position
below a partition's start reads on from its first record.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from astraflow.core.errors import AstraFlowError
from astraflow.log import Consumer, Message, TopicPartition
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk

logger = logging.getLogger(__name__)
WINDOW = 16
"""Manifests read by the first step back from the end (each further step reads twice as many)."""


def decode_or_skip(codec: Codec, message: Message) -> WeightChunk | None:
    """The weights record in ``message``, or ``None`` (logged) when it cannot be decoded."""
    try:
        return codec.decode(message.value, expect=WeightChunk)
    except AstraFlowError as exc:
        logger.error("skipping an undecodable weights record at %s:%d: %s", message.partition, message.offset, exc)
        return None


def seek_start(
    consumer: Consumer,
    topic: str,
    payload: bool,
    end: int,
    codec: Codec,
    poll_timeout: float,
    stop: threading.Event,
    accept: Callable[[WeightChunk], bool] = lambda manifest: True,
) -> None:
    """Assign ``consumer`` the partitions a follower reads (chunks with ``payload``) and position them
    as the module docstring says, starting at a full manifest that ``accept`` takes (a signed one,
    where readers verify); returns early, positioned anyhow, once ``stop`` is set."""
    manifests = TopicPartition(topic, WEIGHTS_MANIFEST_PARTITION)
    chunks = TopicPartition(topic, WEIGHTS_CHUNK_PARTITION)
    consumer.assign([manifests])
    consumer.seek_to_beginning([manifests])
    first = consumer.position(manifests)
    if not payload:  # the last few offsets: on Kafka the last one is the commit marker of the last manifest
        consumer.seek(manifests, max(first, end - WINDOW))
        return
    newest = _newest_full(consumer, manifests, first, end, codec, poll_timeout, stop, accept)
    consumer.assign([manifests, chunks])
    if newest is None:
        consumer.seek_to_beginning([manifests, chunks])
        return
    offset, manifest = newest
    consumer.seek(manifests, offset)
    if manifest.chunk_offset >= 0:
        consumer.seek(chunks, manifest.chunk_offset)
    else:
        consumer.seek_to_beginning([chunks])
    logger.info("following %s from its full version %d (manifest offset %d)", topic, manifest.version, offset)


def _newest_full(
    consumer: Consumer,
    manifests: TopicPartition,
    first: int,
    end: int,
    codec: Codec,
    poll_timeout: float,
    stop: threading.Event,
    accept: Callable[[WeightChunk], bool],
) -> tuple[int, WeightChunk] | None:
    """(offset, manifest) of the last full manifest in ``[first, end)`` that ``accept`` takes, or ``None``."""
    upper, window = end, WINDOW
    while upper > first and not stop.is_set():
        lower = max(first, upper - window)
        consumer.seek(manifests, lower)
        full = None
        while consumer.position(manifests) < upper and not stop.is_set():
            messages = consumer.poll(max_records=window, timeout=poll_timeout)
            if not messages and not consumer.lag().get(manifests):
                break  # the partition ends below ``upper``: it was deleted and made again meanwhile
            for message in messages:
                record = decode_or_skip(codec, message)
                if message.offset < upper and record is not None and record.encoding == "full" and accept(record):
                    full = (message.offset, record)
        if full is not None:
            return full
        upper, window = lower, window * 2
    return None
