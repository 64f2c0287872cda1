"""The AstraFlow exception tree.

Every error the library raises on purpose is an ``AstraFlowError``; callers catch the narrow
subclass they can handle and let the rest surface. Wrapped causes are kept with ``raise ... from``.
"""


class AstraFlowError(Exception):
    """Base of every error AstraFlow raises on purpose."""


class ConfigError(AstraFlowError):
    """A configuration file or value is wrong; the message names the field."""


class SchemaError(AstraFlowError):
    """Bytes that are not a valid AstraFlow Avro record, or a record that does not fit its schema."""


class UnknownSchemaError(SchemaError):
    """A single-object encoded record whose writer-schema fingerprint no store knows."""


class LogError(AstraFlowError):
    """The log (embedded or Kafka) failed an operation."""


class TopicNotFoundError(LogError):
    """The named topic does not exist."""


class DeliveryError(LogError):
    """One or more produced records were not acknowledged by the log."""


class RecordTooLargeError(DeliveryError):
    """A record is larger than the topic or client allows."""


class FencedError(LogError):
    """A newer producer with the same transactional id took over: this one can write nothing more.

    Nothing of its open transaction becomes visible; close it (the newer instance carries on)."""


class TransactionAbortedError(LogError):
    """The log aborted a transaction: nothing it sent and none of its offsets became visible.

    The producer can ``begin`` the next one; the stage re-reads its input from the committed offsets."""


class BrokerError(AstraFlowError):
    """The local Kafka broker could not be fetched, started, or stopped."""


class MissingDependencyError(AstraFlowError):
    """An optional dependency is not installed; the message says how to install it."""


class RewardError(AstraFlowError):
    """A reward function failed; the trajectory is dead-lettered, never given a silent zero."""


class NonFiniteStepError(AstraFlowError):
    """An optimizer step's loss or gradient is not finite: the step was skipped, the weights are unchanged."""


class WeightsError(AstraFlowError):
    """A weight version is incomplete, corrupt, or does not apply to the reader's base."""


class WeightFollowerError(AstraFlowError):
    """A weight follower's thread stopped on an error, so the weights its owner holds would never change again."""


def error_reason(exc: BaseException) -> str:
    """``error: <type>: <text>``: the dead-letter reason of a record or group whose handling raised."""
    return f"error: {type(exc).__name__}: {exc}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was: for error messages and dead-letter
    reasons that quote what something else chose (a server's answer, a producer's id)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} chars)"
