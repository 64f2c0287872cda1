"""``astraflow metrics serve``: a Prometheus endpoint over a run's metrics topic, live, on either backend.

It reads every role's ``{run}.metrics.{role}`` from its oldest record and keeps following them (by assignment, with no
consumer group, so nothing is committed and the run is not disturbed), on the embedded log or
Kafka alike. Each record updates one series, presented by the name's kind in the catalogue
(``metric_names.kind``):

- ``counter``: the record's value, a count that only rises within one emitting process;
- ``gauge``: the newest value;
- ``histogram``: each record is one observation, counted into the catalogue's buckets
  (``metric_names.histogram_buckets``) with their sum and count.

A series is a metric name and the labels ``run``, ``policy`` (empty for a metric of no policy),
``component`` and ``producer`` (the emitting process, the record's ``instance`` label: each
rollout producer, or a restarted process, has series of its own); ``launcher.restarts`` is also
labelled ``child`` and ``feeder.skipped`` ``curator``. Other labels (a scaler decision's inputs,
a system evaluation's version pair) vary per record and are left out. The exposed name is
``astraflow_`` and the metric's name with ``_`` for ``.`` (``train.version`` →
``astraflow_train_version``; counters end in ``_total``).

Needs ``prometheus-client`` (``pip install 'astraflow[monitor]'``).
"""

from __future__ import annotations

import logging
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from astraflow.core.errors import AstraFlowError, MissingDependencyError, TopicNotFoundError
from astraflow.core.metric_names import FEEDER_SKIPPED, LAUNCHER_RESTARTS, histogram_buckets, kind
from astraflow.log import TopicPartition
from astraflow.runtime.attach import AttachedRun
from astraflow.runtime.control import forged_metric
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Metric

logger = logging.getLogger(__name__)
INSTALL_HINT = (
    "`astraflow metrics serve` needs prometheus-client: run `scripts/setup.sh monitor` "
    "(or `pip install 'astraflow[monitor]'`)"
)
LABELS = ("run", "policy", "component", "producer")
EXTRA_LABELS = {LAUNCHER_RESTARTS: ("child",), FEEDER_SKIPPED: ("curator",)}
"""Names with series told apart by more than ``LABELS``: one per launcher child, one per curator."""
PREFIX = "astraflow_"


def exposed_name(name: str) -> str:
    """The Prometheus name of metric ``name``: ``astraflow_`` and the name with ``_`` for anything else."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", name)


@dataclass
class Histogram:
    """The observations of one histogram series: per-bucket counts (the last is ``+Inf``), sum, count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or below it), as Prometheus buckets are given."""
        running, out = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts or [0] * (len(self.bounds) + 1)):
            running += count
            out.append((bound, running))
        return out


class RunMetrics:
    """Every series of one run, updated by ``observe`` and read by Prometheus through ``collect``
    (a custom collector: the registry calls it at each scrape, from the HTTP server's thread)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.values: dict[str, dict[tuple[str, ...], float]] = {}
        self.histograms: dict[str, dict[tuple[str, ...], Histogram]] = {}
        self.records = 0

    def labels_of(self, metric: Metric) -> tuple[str, ...]:
        labels = metric.labels
        base = (self.run, labels.get("policy", ""), metric.component, labels.get("instance", ""))
        return base + tuple(labels.get(extra, "") for extra in EXTRA_LABELS.get(metric.name, ()))

    def observe(self, metric: Metric) -> None:
        key = self.labels_of(metric)
        with self.lock:
            self.records += 1
            if kind(metric.name) == "histogram":
                series = self.histograms.setdefault(metric.name, {})
                series.setdefault(key, Histogram(histogram_buckets(metric.name))).observe(metric.value)
            else:
                self.values.setdefault(metric.name, {})[key] = metric.value

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        with self.lock:
            values = {name: dict(series) for name, series in self.values.items()}
            histograms = {
                name: {key: (h.cumulative(), h.total) for key, h in series.items()}
                for name, series in self.histograms.items()
            }
        for name, series in sorted(values.items()):
            labels = [*LABELS, *EXTRA_LABELS.get(name, ())]
            family_type = CounterMetricFamily if kind(name) == "counter" else GaugeMetricFamily
            family = family_type(exposed_name(name), f"astraflow metric {name}", labels=labels)
            for key, value in series.items():
                family.add_metric(list(key), value)
            yield family
        for name, series in sorted(histograms.items()):
            family = HistogramMetricFamily(exposed_name(name), f"astraflow metric {name}", labels=list(LABELS))
            for key, (buckets, total) in series.items():
                family.add_metric(list(key), buckets, total)
            yield family


def follow_metrics(run: AttachedRun, metrics: RunMetrics, stop: threading.Event, poll_s: float = 1.0) -> None:
    """Feed every record of the run's metrics topics to ``metrics``, oldest first, until ``stop``;
    waits for the topics when the run has not created them yet. A metric its writer's role may
    not write (``runtime/control.py``) is left out, with a warning."""
    topics = RunTopics(run.config.run, run.config.workflow, run.config.policy_names()).metrics_topics()
    codec = Codec()
    while not stop.is_set():
        try:
            assigned = [
                TopicPartition(topic, partition)
                for topic in topics
                for partition in range(run.log.describe_topic(topic).partitions)
            ]
            break
        except TopicNotFoundError:
            stop.wait(poll_s)
    else:
        return
    with run.log.consumer(group_id=None) as consumer:
        consumer.assign(assigned)
        consumer.seek_to_beginning(assigned)
        while not stop.is_set():
            for message in consumer.poll(max_records=5000, timeout=poll_s):
                try:
                    metric = codec.decode(message.value, expect=Metric)
                except AstraFlowError as exc:
                    logger.warning("skipping metric record at offset %d: %s", message.offset, exc)
                    continue
                forged = forged_metric(message.topic, metric)
                if forged is None:
                    metrics.observe(metric)
                else:
                    logger.warning("leaving out a forged metric: %s", forged)


def serve(
    run: AttachedRun, port: int, host: str, stop: threading.Event, on_ready: Callable[[str], None] | None = None
) -> None:
    """Serve ``/metrics`` of ``run`` on ``host:port`` (port 0: any free one) until ``stop``;
    ``on_ready`` gets the URL once the server listens."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise MissingDependencyError(INSTALL_HINT) from exc
    metrics = RunMetrics(run.config.run)
    registry = CollectorRegistry()
    registry.register(metrics)
    server, thread = start_http_server(port, addr=host, registry=registry)
    try:
        if on_ready is not None:
            on_ready(f"http://{host}:{server.server_port}/metrics")
        follow_metrics(run, metrics, stop)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
