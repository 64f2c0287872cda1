"""Per-producer throughput and version lag, from the rollout producers' metrics alone.

Every rollout producer labels its metrics with its ``instance`` (the producer id recorded on its
trajectories), ``region`` and ``hardware``, and after each batch reports the cumulative
``rollout.trajectories`` (per policy) and the batch's ``rollout.version_lag`` (newest version
announced on the weights topic minus the version it sampled with). From these:

- **trajectories**: the newest cumulative count, summed over policies;
- **per_s**: trajectories per second between the producer's first and newest report (the first
  batch's trajectories are the baseline, so a producer needs two reports for a rate);
- **recent_per_s**: the same over the last ``window_s`` seconds before the newest metric seen
  from any producer (so a finished run still shows its final rates);
- **version_lag** / **mean_version_lag**: the newest and the mean reported lag.

``ProducerTally`` also keeps the newest ``scaler.desired_producers`` decision: the dashboard shows
it and ``astraflow run`` resizes its pool to it. Used live by the run monitor and in one pass by
``astraflow stats``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from astraflow.core.metric_names import (
    ROLLOUT_PREFIX,
    ROLLOUT_TRAJECTORIES,
    ROLLOUT_VERSION_LAG,
    SCALER_DESIRED_PRODUCERS,
)
from astraflow.schemas.records import Metric


@dataclass(frozen=True)
class ProducerRow:
    producer: str
    region: str
    hardware: str
    trajectories: int
    per_s: float
    """Trajectories per second between the first and the newest report."""
    recent_per_s: float
    """Trajectories per second over the tally's window."""
    version_lag: float
    """Newest reported version lag (versions behind the newest announced one)."""
    mean_version_lag: float
    last_seen_ms: int


@dataclass
class _Producer:
    region: str = ""
    hardware: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    history: list[tuple[int, int]] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    last_seen_ms: int = 0


@dataclass(frozen=True)
class ScalerDecision:
    desired: int
    rule: str
    reason: str
    created_ms: int


class ProducerTally:
    """Folds metric records into per-producer rows and the newest scaler decision."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_ms = int(window_s * 1000)
        self.decision: ScalerDecision | None = None
        self._producers: dict[str, _Producer] = defaultdict(_Producer)
        self._newest_ms = 0

    def observe(self, metric: Metric) -> None:
        if metric.name == SCALER_DESIRED_PRODUCERS:
            if self.decision is None or metric.created_ms >= self.decision.created_ms:
                self.decision = ScalerDecision(
                    int(metric.value), metric.labels.get("rule", ""), metric.labels.get("reason", ""), metric.created_ms
                )
            return
        if not metric.name.startswith(ROLLOUT_PREFIX):
            return
        instance = metric.labels.get("instance", metric.component)
        producer = self._producers[instance]
        producer.region = metric.labels.get("region", producer.region)
        producer.hardware = metric.labels.get("hardware", producer.hardware)
        producer.last_seen_ms = max(producer.last_seen_ms, metric.created_ms)
        self._newest_ms = max(self._newest_ms, metric.created_ms)
        if metric.name == ROLLOUT_TRAJECTORIES:
            producer.counts[metric.labels.get("policy", "")] = int(metric.value)
            point = (metric.created_ms, sum(producer.counts.values()))
            if producer.history and producer.history[-1][0] == metric.created_ms:
                producer.history[-1] = point  # the other policies of the same batch
            else:
                producer.history.append(point)
        elif metric.name == ROLLOUT_VERSION_LAG:
            producer.lags.append(metric.value)

    @property
    def desired(self) -> int | None:
        return self.decision.desired if self.decision else None

    def rows(self) -> list[ProducerRow]:
        """One row per producer that reported, by producer id."""
        start = self._newest_ms - self.window_ms
        out = []
        for name, p in sorted(self._producers.items()):
            history = sorted(p.history)
            recent = [point for point in history if point[0] >= start]
            base = [point for point in history if point[0] < start][-1:] or recent[:1]
            out.append(
                ProducerRow(
                    producer=name,
                    region=p.region,
                    hardware=p.hardware,
                    trajectories=history[-1][1] if history else 0,
                    per_s=_rate(history[0], history[-1]) if history else 0.0,
                    recent_per_s=_rate(base[0], recent[-1]) if recent and base else 0.0,
                    version_lag=p.lags[-1] if p.lags else 0.0,
                    mean_version_lag=sum(p.lags) / len(p.lags) if p.lags else 0.0,
                    last_seen_ms=p.last_seen_ms,
                )
            )
        return out


def _rate(first: tuple[int, int], last: tuple[int, int]) -> float:
    seconds = (last[0] - first[0]) / 1000
    return (last[1] - first[1]) / seconds if seconds > 0 else 0.0


def producer_rows(metrics: list[Metric], window_s: float = 60.0) -> list[ProducerRow]:
    """``ProducerTally.rows`` over a list of metric records (for ``astraflow stats``)."""
    tally = ProducerTally(window_s)
    for metric in sorted(metrics, key=lambda m: m.created_ms):
        tally.observe(metric)
    return tally.rows()
