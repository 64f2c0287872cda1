"""Every path of a run directory, in one place, and the machine-wide cache.

A run directory (``runs/<run>`` unless ``--run-dir`` says otherwise) holds what a run leaves on
disk next to its log::

    config.yaml        the resolved config the run was started with
    log.sqlite         the embedded log (absent on the kafka backend)
    base/[<policy>/]   the base checkpoint (``astraflow warmup``), unless ``model.path`` names one
    data/              the task's generated splits and corpora
    checkpoints/<policy>/vNNNNNNNN/   the trainer's checkpoints
    final/<policy>/    the newest checkpoint of each policy at the end of a run, as a Hugging Face
                       ``save_pretrained`` directory with the tokenizer (named in summary.json)
    tensorboard/       TensorBoard event files of the run's metrics, written as it goes
    logs/              one log file per component process
    metrics.jsonl  summary.json  report.png   what ``astraflow run`` writes as it goes and at the end

Components, analysis tools and the launcher name these paths through ``RunDir`` only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    """The machine-wide cache (``$ASTRAFLOW_CACHE``, else ``~/.cache/astraflow``): base checkpoints, compiled ops."""
    return Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow"))


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory; nothing is created or read here."""

    root: Path

    @classmethod
    def default(cls, run: str) -> RunDir:
        """Where a run named ``run`` lives when no ``--run-dir`` is given: ``runs/<run>``."""
        return cls(Path("runs") / run)

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def log(self) -> Path:
        return self.root / "log.sqlite"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def report(self) -> Path:
        return self.root / "report.png"

    def base(self, policy: str | None = None) -> Path:
        """The base checkpoint built for this run; ``policy`` for each policy of a multi-policy run."""
        return self.root / "base" / policy if policy else self.root / "base"

    def checkpoints(self, policy: str) -> Path:
        return self.root / "checkpoints" / policy

    def final_model(self, policy: str) -> Path:
        """Where a run leaves ``policy``'s final version as a ``save_pretrained`` directory."""
        return self.root / "final" / policy

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    def looks_like_run(self) -> bool:
        """True when this is a directory a run wrote (its config or its embedded log is here)."""
        return self.root.is_dir() and (self.config.exists() or self.log.exists())
