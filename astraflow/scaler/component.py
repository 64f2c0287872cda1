"""``astraflow scale``: the autoscaling signal as a component of its own, on the run's log.

Steps (every ``scaler.interval_s``):

1. Read the metrics topic (no consumer group; at start from ``window_s`` ago) into a
   ``ScalerWindow``: trainer wait and step seconds, which producers reported, their busy seconds.
2. Sample the trainer's input: records appended to ``{run}.samples.{policy}`` and the trainer
   group's committed offsets on it (``Log.group_offsets``, read-only: the group is never joined).
3. Decide (``AutoScaler``, rule in ``rule.py``) and write two metrics: ``scaler.wait_fraction``
   and ``scaler.desired_producers`` labelled with the rule, the reason in words, the bounds and
   every input of the decision (``producers``, ``steps``, ``wait_fraction``, ``entered``,
   ``consumed``, ``busy``, ``waiting_s``, ``at_ms``, ``started_ms``), so any decision can be audited and
   replayed. Holds are written too, so a reader always finds the current desired count.

The scaler starts and stops nothing. ``astraflow run`` reads the decisions from the metrics topic
and resizes its local pool (``infra/launch/pool.py``); on a cluster an external orchestrator (a
Kubernetes controller, KEDA on the metric) can act on the same records instead.
"""

from __future__ import annotations

import logging
import threading
import time

from astraflow.core.errors import AstraFlowError
from astraflow.core.metric_names import SCALER_DESIRED_PRODUCERS, SCALER_WAIT_FRACTION
from astraflow.log import TopicPartition
from astraflow.runtime.context import ComponentContext, now_ms
from astraflow.runtime.control import forged_metric
from astraflow.scaler.rule import AutoScaler, Decision, ScalerWindow, capped
from astraflow.schemas.records import Metric

logger = logging.getLogger(__name__)


class ScalerComponent:
    """Follows one policy's trainer and writes the desired number of rollout producers."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        self.ctx = ctx
        self.cfg = capped(ctx.config.scaler, ctx.config.log.partitions)
        if self.cfg.max_producers < ctx.config.scaler.max_producers:
            logger.warning(
                "scaler.max_producers %d capped at log.partitions %d",
                ctx.config.scaler.max_producers,
                self.cfg.max_producers,
            )
        self.samples_topic = ctx.topics.samples(policy)
        self.train_group = f"{ctx.config.run}.train.{policy}"
        self.window = ScalerWindow(self.cfg.window_s, ctx.config.train.batch_samples)
        self.started_ms = now_ms()
        self.scaler = AutoScaler(self.cfg, ctx.config.rollout.producers, self.started_ms)
        self.decisions = 0
        self.forged = 0
        """Metrics read from a role not allowed to write them (``runtime/control.py``), never acted on."""

    def run(self, stop: threading.Event) -> None:
        ctx = self.ctx
        consumer = ctx.log.consumer(group_id=None)
        partitions = [
            TopicPartition(topic, p)
            for topic in ctx.topics.metrics_topics()
            for p in range(ctx.log.describe_topic(topic).partitions)
        ]
        consumer.assign(partitions)
        consumer.seek_to_timestamp(now_ms() - int(self.cfg.window_s * 1000), partitions)
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                for message in consumer.poll(max_records=2000, timeout=0.5):
                    try:
                        metric = ctx.codec.decode(message.value, expect=Metric)
                    except AstraFlowError as exc:
                        logger.warning("skipping an undecodable metric at offset %d: %s", message.offset, exc)
                        continue
                    forged = forged_metric(message.topic, metric)
                    if forged is not None:
                        self.forged += 1
                        logger.warning("not acting on a forged metric at offset %d: %s", message.offset, forged)
                    elif metric.component != ctx.component:
                        self.window.add_metric(metric)
                if time.monotonic() >= next_at:
                    self.tick(now_ms())
                    next_at = time.monotonic() + self.cfg.interval_s
        finally:
            consumer.close()

    def tick(self, at_ms: int) -> Decision:
        """Steps 2 and 3 of the module docstring."""
        entered = sum(self.ctx.log.end_offsets(self.samples_topic).values())
        committed = self.ctx.log.group_offsets().get(self.train_group, {})
        consumed = sum(offset for tp, offset in committed.items() if tp.topic == self.samples_topic)
        self.window.add_offsets(at_ms, entered, consumed)
        observation = self.window.observe(at_ms)
        previous = self.scaler.desired
        decision = self.scaler.step(observation, at_ms)
        self.decisions += 1
        if decision.desired != previous:
            logger.info("desired producers %d -> %d: %s", previous, decision.desired, decision.reason)
        if observation.wait_fraction is not None:
            self.ctx.metric(SCALER_WAIT_FRACTION, observation.wait_fraction, self.decisions)
        inputs = {
            "producers": observation.producers,
            "steps": observation.steps,
            "wait_fraction": observation.wait_fraction,
            "entered": observation.entered,
            "consumed": observation.consumed,
            "busy": observation.busy_fraction,
            "waiting_s": observation.waiting_s,
            "at_ms": at_ms,
            "started_ms": self.started_ms,
        }
        self.ctx.metric(
            SCALER_DESIRED_PRODUCERS,
            decision.desired,
            self.decisions,
            rule=decision.rule,
            reason=decision.reason,
            bounds=f"{self.cfg.min_producers}-{self.cfg.max_producers}",
            **{key: "" if value is None else str(value) for key, value in inputs.items()},
        )
        self.ctx.producer.flush()
        return decision
