"""Topic names and settings of a run: ``{run}.{kind}.{name}`` (see docs/architecture.md, "Topics and records").

One place decides every topic's partitions and limits so that all components, on either backend,
create and read the same layout. The weights topic has two partitions on purpose: manifests go to
partition 0 and payload chunks to partition 1, so components that only need the trainer's current
version (feeder back-pressure, staleness filter) read the small manifests and never the chunks.
Its records may be as large as ``weights.chunk_bytes`` plus 1 MiB of headroom for the envelope.
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.config.log import ADMIN, ROLES
from astraflow.core.errors import ConfigError
from astraflow.log import Log, TopicSpec

WEIGHTS_MANIFEST_PARTITION = 0
WEIGHTS_CHUNK_PARTITION = 1
MiB = 1024 * 1024
CHANGELOG_SEGMENT_MS = 60_000
"""A stream changelog rolls its Kafka segment every minute, so compaction keeps what a restarted
processor reads near the newest value of each key (``TopicSpec.segment_ms``)."""


CONTROL_ROLES = (*(role for role in ROLES if role != "analysis"), ADMIN)
"""The roles that write metrics and dead letters, each to a topic of its own (``runtime/control.py``):
every component role but ``analysis``, which writes nothing, and ``admin`` (the launcher)."""


@dataclass(frozen=True)
class RunTopics:
    """The topic names of one run for one workflow and its policies."""

    run: str
    workflow: str
    policies: tuple[str, ...]

    def tasks(self) -> str:
        return f"{self.run}.tasks.{self.workflow}"

    def trajectories(self, policy: str) -> str:
        return f"{self.run}.trajectories.{policy}"

    def samples(self, policy: str) -> str:
        return f"{self.run}.samples.{policy}"

    def weights(self, policy: str) -> str:
        return f"{self.run}.weights.{policy}"

    def feedback(self) -> str:
        return f"{self.run}.feedback.{self.workflow}"

    def metrics(self, role: str) -> str:
        """The metrics ``role`` writes; only its principal may write there on the secure broker."""
        return f"{self.run}.metrics.{role}"

    def deadletter(self, role: str) -> str:
        """The dead letters ``role`` writes; only its principal may write there on the secure broker."""
        return f"{self.run}.deadletter.{role}"

    def metrics_topics(self) -> list[str]:
        """Every role's metrics topic (``CONTROL_ROLES``), which readers of the run's metrics follow together."""
        return [self.metrics(role) for role in CONTROL_ROLES]

    def deadletter_topics(self) -> list[str]:
        """Every role's dead-letter topic (``CONTROL_ROLES``)."""
        return [self.deadletter(role) for role in CONTROL_ROLES]

    def ledger(self, policy: str) -> str:
        """What made each weight version of ``policy`` (``LedgerEntry``), written by its trainer."""
        return f"{self.run}.ledger.{policy}"

    def episodes(self, policy: str) -> str:
        """The completed turns of ``policy``'s episodes still going, keyed by episode (compacted; a finished
        episode's tombstone goes with its trajectory: ``producers/rollout/episode_journal.py``)."""
        return f"{self.run}.episodes.{policy}"

    def stream_changelog(self, policy: str) -> str:
        """The native stream processor's state: half-filled groups, closed group ids, operator state."""
        return f"{self.run}.stream.{policy}.changelog"

    def specs(self, partitions: int, chunk_bytes: int = 4 * MiB) -> list[TopicSpec]:
        """Every topic of the run with its settings (``partitions`` for the shared-work topics)."""
        specs = [
            TopicSpec(self.tasks(), partitions=partitions),
            TopicSpec(self.feedback(), partitions=1),
            *(TopicSpec(topic, partitions=1) for topic in self.metrics_topics()),
            *(TopicSpec(topic, partitions=1, max_message_bytes=32 * MiB) for topic in self.deadletter_topics()),
        ]
        for policy in self.policies:
            specs += [
                TopicSpec(self.trajectories(policy), partitions=partitions),
                TopicSpec(self.samples(policy), partitions=1),
                TopicSpec(self.ledger(policy), partitions=1),
                TopicSpec(
                    self.episodes(policy),
                    partitions=partitions,  # one per tasks partition: its episodes' turns
                    compacted=True,
                    segment_ms=CHANGELOG_SEGMENT_MS,
                ),
                TopicSpec(self.weights(policy), partitions=2, max_message_bytes=chunk_bytes + MiB),
                TopicSpec(
                    self.stream_changelog(policy),
                    partitions=partitions,  # one per trajectories partition: its state (``streams.changelog``)
                    compacted=True,
                    max_message_bytes=32 * MiB,
                    segment_ms=CHANGELOG_SEGMENT_MS,
                ),
            ]
        return specs

    def ensure(self, log: Log, partitions: int, chunk_bytes: int = 4 * MiB) -> None:
        """Create whatever topics of the run do not exist yet (idempotent, safe from any process).

        A weights topic that already exists with records too small for ``chunk_bytes`` chunks is a
        ``ConfigError``: its limit is fixed at creation, and every publish would fail otherwise.
        """
        for spec in self.specs(partitions, chunk_bytes):
            log.create_topic(spec, exist_ok=True)
            if spec.name in {self.weights(policy) for policy in self.policies}:
                limit = log.describe_topic(spec.name).max_message_bytes
                if limit < spec.max_message_bytes:
                    raise ConfigError(
                        f"weights.chunk_bytes: {chunk_bytes} needs records of {spec.max_message_bytes} bytes, "
                        f"but topic {spec.name!r} exists with max.message.bytes {limit}; "
                        "lower chunk_bytes or recreate the topic"
                    )
