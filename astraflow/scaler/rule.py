"""The autoscaling rule: how many rollout producers the trainer needs, from what the log shows.

The rule is the AstraFlow repo's dead band (docs/algorithms.md, "Autoscaling"), evaluated over the
last ``scaler.window_s`` seconds:

- ``w`` = Σ ``train.wait_seconds`` / Σ (``train.wait_seconds`` + ``train.step_seconds``) over the
  trainer steps in the window: the fraction of its time the trainer waited for samples. The
  trainer reports a wait only with the step that ends it, so a starved trainer would report
  nothing at all; the wait *in progress* (since its last step, or since it started, while fewer
  than ``train.batch_samples`` samples wait for it) counts as waiting too. A trainer that has not
  started yet, or has stepped nowhere in the window with a batch waiting, gives no ``w`` (hold);
  ``G`` = the producers that reported in the window (the previous decision when none did).
- ``w > 0.10`` (``scale_up_above``): target ``⌈G / (1 − w)⌉``: with ``G`` producers the trainer got
  ``1 − w`` of the samples it could use, so ``G / (1 − w)`` would have kept it busy.
- ``w < 0.05`` (``scale_down_below``): target ``min(G, ⌈G · consumed/entered · 1.10⌉)``.
- otherwise hold.

``consumed`` and ``entered`` are counted where the trainer's input is: samples the trainer
committed and samples appended to ``{run}.samples.{policy}`` in the window, so the stream
processor's filters (zero variance, stale) do not look like overproduction. Departure from the
paper: our feeder's back-pressure caps the samples in flight at the staleness budget, so a pool
larger than needed does not build a backlog (consumed/entered stays near 1), its producers idle
instead. ``entered`` is therefore taken at the pool's capacity: the samples it would have entered
working flat out, ``entered / b`` with ``b`` the producers' busy fraction (``rollout.busy_seconds``
over their time alive in the window; 1 when unknown). The ratio used is ``consumed/entered · b``.

Guards around the rule (``AutoScaler``): decisions hold for ``cooldown_s`` after start and after
every change, so new producers show their effect before the next one; a scale-up never lowers and
a scale-down never raises the previous decision; every target is clamped to
``[min_producers, max_producers]``. Every decision, holds included, is returned with its rule
and a reason in words; ``scale_component`` writes it to the metrics topic.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from astraflow.config import ScalerConfig
from astraflow.core.metric_names import (
    ROLLOUT_BUSY_SECONDS,
    ROLLOUT_PREFIX,
    TRAIN_PREFIX,
    TRAIN_STEP_SECONDS,
    TRAIN_WAIT_SECONDS,
)
from astraflow.schemas.records import Metric


@dataclass(frozen=True)
class Observation:
    """What the scaler saw over one window."""

    producers: int
    """Producers that reported in the window (G)."""
    steps: int
    """Trainer steps reported in the window."""
    wait_fraction: float | None
    """w, or ``None`` when the window holds no trainer time (before its first metric, or while it
    computes with a batch waiting)."""
    consumed: int
    """Samples the trainer committed in the window."""
    entered: int
    """Samples appended to the trainer's input topic in the window."""
    busy_fraction: float | None = None
    """Share of their time alive in the window that the producers spent generating; ``None``: unknown."""
    waiting_s: float = 0.0
    """The trainer's wait in progress counted in ``wait_fraction`` (seconds)."""


@dataclass(frozen=True)
class Decision:
    """The desired number of producers, which band of the rule chose it, and why."""

    desired: int
    rule: str
    """``up``, ``down`` or ``hold``."""
    reason: str


def decide(obs: Observation, previous: int, cfg: ScalerConfig) -> Decision:
    """The dead-band rule of the module docstring applied to one window (no cooldown here)."""
    g = obs.producers or previous
    w = obs.wait_fraction
    if w is None:
        return Decision(
            previous, "hold", "no trainer time in the window yet (not started, or busy with its first step)"
        )
    if w > cfg.scale_up_above:
        if w >= 1.0:
            target, formula = cfg.max_producers, "never fed in the window: the maximum"
        else:
            target = math.ceil(round(g / (1.0 - w), 9))
            formula = f"⌈{g}/(1−{w:.3f})⌉ = {target}{_bounded(target, cfg)}"
        desired = max(previous, _clamp(target, cfg))
        return Decision(desired, "up", f"trainer waited {w:.1%} > {cfg.scale_up_above:.0%}: {formula}")
    if w < cfg.scale_down_below:
        if obs.entered <= 0:
            return Decision(previous, "hold", f"trainer waited {w:.1%}, but no samples entered in the window")
        busy = 1.0 if obs.busy_fraction is None else obs.busy_fraction
        ratio = obs.consumed / obs.entered * busy
        target = min(g, math.ceil(round(g * ratio * cfg.headroom, 9)))
        desired = min(previous, _clamp(target, cfg))
        return Decision(
            desired,
            "down",
            f"trainer waited {w:.1%} < {cfg.scale_down_below:.0%}: consumed/entered {obs.consumed}/{obs.entered} "
            f"x busy {busy:.2f} = {ratio:.3f}; "
            f"min({g}, ⌈{g}·{ratio:.3f}·{cfg.headroom:.2f}⌉) = {target}{_bounded(target, cfg)}",
        )
    return Decision(
        previous,
        "hold",
        f"trainer waited {w:.1%}, inside the dead band [{cfg.scale_down_below:.0%}, {cfg.scale_up_above:.0%}]",
    )


def capped(cfg: ScalerConfig, partitions: int) -> ScalerConfig:
    """``cfg`` with ``max_producers`` at most the tasks topic's partitions: a producer beyond them
    gets no partition of the consumer group and idles."""
    if cfg.max_producers <= partitions:
        return cfg
    return cfg.model_copy(update={"max_producers": partitions, "min_producers": min(cfg.min_producers, partitions)})


def _clamp(target: int, cfg: ScalerConfig) -> int:
    return max(cfg.min_producers, min(cfg.max_producers, target))


def _bounded(target: int, cfg: ScalerConfig) -> str:
    clamped = _clamp(target, cfg)
    return "" if clamped == target else f", bounded to {clamped}"


class ScalerWindow:
    """The inputs of ``decide`` over a sliding window, fed metric records and offset samples.

    Times are the records' ``created_ms`` and the ``at_ms`` of each offset sample: nothing here
    reads a clock, so recorded runs replay exactly.
    """

    def __init__(self, window_s: float, batch_samples: int) -> None:
        self.window_ms = int(window_s * 1000)
        self.batch_samples = batch_samples
        self._trainer_ms: int | None = None
        """When the trainer last stepped, or first reported anything."""
        self._steps: dict[tuple[str, int], dict[str, float]] = {}
        self._step_ms: dict[tuple[str, int], int] = {}
        self._seen_ms: dict[str, int] = {}
        self._busy: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self._offsets: deque[tuple[int, int, int]] = deque()

    def add_metric(self, metric: Metric) -> None:
        """Take in one record of the metrics topic; records the scaler does not use are ignored."""
        instance = metric.labels.get("instance", metric.component)
        if metric.name in (TRAIN_WAIT_SECONDS, TRAIN_STEP_SECONDS):
            key = (instance, metric.step)
            self._steps.setdefault(key, {})[metric.name] = metric.value
            self._step_ms[key] = max(self._step_ms.get(key, 0), metric.created_ms)
            self._trainer_ms = max(self._trainer_ms or 0, metric.created_ms)
        elif metric.name.startswith(TRAIN_PREFIX) and self._trainer_ms is None:
            self._trainer_ms = metric.created_ms
        elif metric.name.startswith(ROLLOUT_PREFIX):
            self._seen_ms[instance] = max(self._seen_ms.get(instance, 0), metric.created_ms)
            if metric.name == ROLLOUT_BUSY_SECONDS:
                self._busy[instance].append((metric.created_ms, metric.value))

    def add_offsets(self, at_ms: int, entered_total: int, consumed_total: int) -> None:
        """Samples appended to the trainer's input topic, and committed by the trainer, so far."""
        self._offsets.append((at_ms, entered_total, consumed_total))

    def observe(self, now_ms: int) -> Observation:
        """The window ending at ``now_ms``; older inputs than the window needs are forgotten."""
        start = now_ms - self.window_ms
        self._forget(start)
        steps = [v for key, v in self._steps.items() if self._step_ms[key] >= start and len(v) == 2]
        waited = sum(v[TRAIN_WAIT_SECONDS] for v in steps)
        total = waited + sum(v[TRAIN_STEP_SECONDS] for v in steps)
        waiting = 0.0
        if (
            self._trainer_ms is not None
            and self._offsets
            and self._offsets[-1][1] - self._offsets[-1][2] < self.batch_samples
        ):
            waiting = max(0, now_ms - max(start, self._trainer_ms)) / 1000
        total += waiting
        wait_fraction = (waited + waiting) / total if self._trainer_ms is not None and total > 0 else None
        active = [instance for instance, seen in self._seen_ms.items() if seen >= start]
        entered = consumed = 0
        if len(self._offsets) >= 2:
            base = self._offsets[0]
            entered, consumed = self._offsets[-1][1] - base[1], self._offsets[-1][2] - base[2]
        return Observation(
            len(active),
            len(steps),
            wait_fraction,
            max(consumed, 0),
            max(entered, 0),
            self._busy_fraction(active, start, now_ms),
            waiting,
        )

    def _busy_fraction(self, active: list[str], start: int, now_ms: int) -> float | None:
        busy = alive = 0.0
        for instance in active:
            reports = self._busy.get(instance)
            if not reports:
                continue
            before = [r for r in reports if r[0] <= start]
            if before:
                since_ms, baseline = start, before[-1][1]
            else:  # joined in the window: it was busy at least for its first report's count
                since_ms, baseline = max(start, int(reports[0][0] - reports[0][1] * 1000)), 0.0
            busy += reports[-1][1] - baseline
            alive += (now_ms - since_ms) / 1000
        return min(1.0, busy / alive) if alive > 0 else None

    def _forget(self, start: int) -> None:
        for key in [k for k, ms in self._step_ms.items() if ms < start]:
            del self._steps[key], self._step_ms[key]
        for instance in [i for i, ms in self._seen_ms.items() if ms < start]:
            del self._seen_ms[instance]
        for reports in self._busy.values():
            while len(reports) > 1 and reports[1][0] <= start:
                reports.pop(0)
        while len(self._offsets) > 1 and self._offsets[1][0] <= start:
            self._offsets.popleft()


class AutoScaler:
    """``decide`` with the guards of the module docstring: bounds, direction, cooldown."""

    def __init__(self, cfg: ScalerConfig, initial: int, started_ms: int) -> None:
        self.cfg = cfg
        self.desired = _clamp(initial, cfg)
        self.changed_ms = started_ms

    def step(self, obs: Observation, now_ms: int) -> Decision:
        """The decision for the window ``obs`` ending at ``now_ms``."""
        left = self.cfg.cooldown_s - (now_ms - self.changed_ms) / 1000
        if left > 0:
            return Decision(self.desired, "hold", f"cooling down for {left:.0f} s more after the last change")
        decision = decide(obs, self.desired, self.cfg)
        if decision.desired != self.desired:
            self.desired = decision.desired
            self.changed_ms = now_ms
        return decision
