"""The ``scaler`` section: autoscaling of the rollout producers."""

from __future__ import annotations

from pydantic import Field, model_validator

from astraflow.config.base import Section


class ScalerConfig(Section):
    """Autoscaling of the rollout producers from the trainer's wait fraction
    (``astraflow scale``; rule in ``astraflow.scaler.rule``)."""

    enabled: bool = False
    """Run the scaler with ``astraflow run`` and start / stop local rollout producers to its decisions."""
    min_producers: int = Field(default=1, ge=1, le=64)
    """Fewest rollout producers the scaler asks for."""
    max_producers: int = Field(default=4, ge=1, le=64)
    """Most rollout producers the scaler asks for (``astraflow run`` also caps it at ``log.partitions``)."""
    window_s: float = Field(default=60.0, ge=1.0, le=86400.0)
    """Seconds of trainer steps and producer reports each decision looks back over."""
    interval_s: float = Field(default=10.0, gt=0.0, le=3600.0)
    """Seconds between two decisions written to the metrics topic."""
    cooldown_s: float = Field(default=60.0, ge=0.0, le=86400.0)
    (
        "Seconds after a change (and after start) during which the decision holds, so new producers can show their "
        "effect."
    )
    scale_up_above: float = Field(default=0.10, gt=0.0, lt=1.0)
    """Wait fraction above which the pool grows to ⌈G / (1 − w)⌉."""
    scale_down_below: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Wait fraction below which the pool shrinks to ⌈G · consumed/entered · headroom⌉."""
    headroom: float = Field(default=1.10, ge=1.0, le=4.0)
    """Spare capacity kept when shrinking (1.10: ten per cent)."""

    @model_validator(mode="after")
    def _ordered(self) -> "ScalerConfig":
        if self.min_producers > self.max_producers:
            raise ValueError(
                f"min_producers ({self.min_producers}) must not exceed max_producers ({self.max_producers})"
            )
        if self.scale_down_below > self.scale_up_above:
            raise ValueError(
                f"scale_down_below ({self.scale_down_below}) must not exceed scale_up_above ({self.scale_up_above})"
            )
        return self
