"""Helpers for tests that run the real ``Trainer`` on a tiny model: its config, and a stop at a version."""

from __future__ import annotations

import threading
from pathlib import Path

from astraflow.basemodel.tiny import TinyModelSpec, create_tiny_checkpoint
from astraflow.config import RunConfig, load_config
from astraflow.consumers.trainer.component import Trainer
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import TrainSample

REPO = Path(__file__).resolve().parents[2]


UNBOUNDED = {"mode": "async", "stream": {"max_staleness": 1_000_000}}
"""No staleness bound: the recorded samples (all of version 0) train any number of versions, as a
replay's would; a test of the bound sets its own."""


def tiny_math_config(tmp_path: Path, overrides: dict) -> RunConfig:
    """The math example's config over a tiny model made in ``tmp_path/base``, without a staleness bound
    (``UNBOUNDED``), with ``overrides``."""
    base = create_tiny_checkpoint(tmp_path / "base", TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2))
    return load_config(
        REPO / "examples" / "math" / "config.yaml", {**UNBOUNDED, "model": {"path": str(base)}, **overrides}
    )


def send_samples(ctx: ComponentContext, samples: list[TrainSample]) -> None:
    """Write ``samples`` to the policy ``main``'s samples topic, all to partition 0 (in order), and flush."""
    for sample in samples:
        key = sample.trajectory.group_id.encode()
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=key, partition=0)
    ctx.producer.flush()


def stopping_at(trainer: Trainer, version: int, stop: threading.Event, crash: bool = False) -> Trainer:
    """Make ``trainer`` set ``stop`` (or, with ``crash``, die as if killed) once it published ``version``."""
    step = trainer._step

    def step_then_stop(*args: object) -> None:
        step(*args)
        if trainer.learner.version >= version:
            if crash:
                raise RuntimeError("killed")
            stop.set()

    trainer._step = step_then_stop
    return trainer
