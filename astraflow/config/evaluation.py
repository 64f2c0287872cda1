"""The ``eval`` section: the evaluators started with ``astraflow run``."""

from __future__ import annotations

from pydantic import Field

from astraflow.config.base import Section


class EvalConfig(Section):
    enabled: bool = True
    (
        "Start the evaluators (each policy's, and the system evaluator) with ``astraflow run``; off for a simulated "
        "cluster, which has no model to score."
    )
    every_versions: int = Field(default=1, ge=1)
    """Evaluate at most once per this many versions (the newest version wins when behind)."""
    final: bool = True
    (
        "When the run stops, each policy's evaluator scores the newest version once more if it had not "
        "(``every_versions`` or a version published during the last evaluation can leave it unscored), "
        "so the run's last evaluation is of the weights it ends with, and the system evaluator the newest "
        "version pair; the launcher stops the evaluators last for it."
    )
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads of the evaluator process."""
