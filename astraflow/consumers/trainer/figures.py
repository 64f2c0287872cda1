"""What the trainer reports of each version it publishes, as ``train.*`` metrics (``metric_names``)."""

from __future__ import annotations

from typing import Any

from astraflow.weights.publish import PublishStats


def version_figures(
    stats: Any, waited: float, staleness: list[int], trained_samples: int, published: PublishStats
) -> dict[str, float]:
    """The figures of one version: the step's ``stats`` (a ``StepStats``), the seconds ``waited`` for its
    batch, its samples' ``staleness``, the samples trained so far and the ``published`` version's size."""
    return {
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "step_seconds": stats.seconds,
        "wait_seconds": waited,
        "staleness_max": max(staleness),
        "samples": trained_samples,
        "weights_bytes": published.total_bytes,
        "weights_changed_fraction": published.changed / max(published.elements, 1),
        **stats.loss_stats,
    }
