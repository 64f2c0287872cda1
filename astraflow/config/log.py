"""The ``log`` section: which log joins the components."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from astraflow.config.base import Section


class LogConfig(Section):
    backend: Literal["embedded", "kafka"] = "embedded"
    """Which log joins the components: a SQLite file in the run directory, or Apache Kafka."""
    bootstrap: str | None = None
    """Kafka bootstrap servers (``host:port``); required when ``backend`` is ``kafka``."""
    partitions: int = Field(default=2, ge=1, le=64)
    """Partitions of the tasks and trajectories topics (the most producers / processors that share work)."""

    @model_validator(mode="after")
    def _kafka_needs_bootstrap(self) -> "LogConfig":
        if self.backend == "kafka" and not self.bootstrap:
            raise ValueError("bootstrap is required when backend is 'kafka' (e.g. 127.0.0.1:9092)")
        return self
