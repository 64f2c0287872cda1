"""The ``stop`` section: when ``astraflow run`` stops."""

from __future__ import annotations

from pydantic import Field

from astraflow.config.base import Section


class StopConfig(Section):
    max_minutes: float = Field(default=10.0, gt=0.0)
    """Wall-clock budget of ``astraflow run`` after warm-up."""
    target_accuracy: float | None = Field(default=None, gt=0.0, le=1.0)
    """Stop early once held-out accuracy reaches this (``None``: run for the whole budget)."""
    max_versions: int | None = Field(default=None, ge=1)
    """Stop once the trainer has published this many versions."""
    target_gain: float | None = Field(default=None, gt=0.0, le=1.0)
    (
        "Stop early once every policy's held-out accuracy, as the mean of its last two evaluations after the base, is "
        "this much above its base (``None``: no such stop)."
    )
