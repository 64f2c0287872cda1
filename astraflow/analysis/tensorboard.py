"""TensorBoard event files of a run's metrics: one scalar per metric name, stepped by version.

The run monitor (``infra/launch/monitor.py``) hands every metric it believes (of the
``{run}.metrics.{role}`` topics) to a ``TensorBoardWriter`` as it reads it, so
``RUN_DIR/tensorboard/`` fills while the run goes
(``tensorboard --logdir RUN_DIR/tensorboard``). A scalar's tag is the metric's name (``train.loss``),
followed by ``/<policy>`` in a run of several policies; its step is the record's ``step`` (the
weight version for most names, ``metric_names`` says which); its wall time the record's. A name
that several processes emit (each rollout producer's ``rollout.trajectories``) has a point from
each; ``astraflow metrics serve`` keeps them apart by label.

Written with ``tensorboardX`` (``pip install 'astraflow[monitor]'``), which needs neither
TensorFlow nor TensorBoard itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from astraflow.core.errors import MissingDependencyError
from astraflow.schemas.records import Metric

INSTALL_HINT = (
    "TensorBoard event files need tensorboardX: run `scripts/setup.sh monitor` (or `pip install 'astraflow[monitor]'`)"
)
FLUSH_S = 5
"""Seconds between flushes of the event file, so TensorBoard sees a live run."""


class TensorBoardWriter:
    """Scalars of metric records into one event file under ``directory``."""

    def __init__(self, directory: Path, policies: Sequence[str]) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise MissingDependencyError(INSTALL_HINT) from exc
        directory.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(logdir=str(directory), flush_secs=FLUSH_S)
        self.several = len(policies) > 1
        self.written = 0

    def tag(self, metric: Metric) -> str:
        """``name``, or ``name/policy`` for a policy's metric in a run of several policies."""
        policy = metric.labels.get("policy")
        return f"{metric.name}/{policy}" if self.several and policy else metric.name

    def add(self, metric: Metric) -> None:
        wall = metric.created_ms / 1000
        self.writer.add_scalar(self.tag(metric), metric.value, global_step=metric.step, walltime=wall)
        self.written += 1

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
