"""Who may write what on the control plane (``runtime/control.py``): every metric prefix and every
kind of dead letter, from its own role and from every other one."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import parse_config
from astraflow.config.log import ADMIN
from astraflow.core import metric_names
from astraflow.infra.launch.monitor import RunMonitor
from astraflow.log import open_log
from astraflow.runtime.context import ComponentContext
from astraflow.runtime.control import (
    LETTER_WRITERS,
    METRIC_OWNERS,
    forged_letter,
    forged_metric,
    metric_owner,
)
from astraflow.runtime.topics import CONTROL_ROLES, RunTopics
from astraflow.schemas.records import DeadLetter, Metric

TOPICS = RunTopics("r", "math", ("main",))


def metric(name: str) -> Metric:
    return Metric("x", name, 1.0, 1, 0)


def letter(topic: str) -> DeadLetter:
    """A well-formed dead letter of the record at offset 5 of ``topic`` (of no record for ``""``)."""
    return DeadLetter("x", "why", "", topic, 0 if topic else -1, 5 if topic else -1, None, b"", 0)


def test_every_metric_name_of_the_catalogue_has_one_owner_among_the_roles() -> None:
    names = [value for key, value in vars(metric_names).items() if key.isupper() and isinstance(value, str)]
    assert names and all(metric_owner(name) in CONTROL_ROLES for name in names), names
    assert set(METRIC_OWNERS.values()) <= set(CONTROL_ROLES)


@pytest.mark.parametrize("prefix", list(METRIC_OWNERS))
def test_a_metric_is_believed_from_its_owner_and_admin_only(prefix: str) -> None:
    owner = METRIC_OWNERS[prefix]
    for role in CONTROL_ROLES:
        reason = forged_metric(TOPICS.metrics(role), metric(prefix + "x"))
        assert (reason is None) == (role in (owner, ADMIN)), (role, prefix, reason)
        if reason is not None:
            assert f"only the {owner} role writes" in reason and TOPICS.metrics(role) in reason


def test_a_metric_no_role_owns_is_believed_from_no_component() -> None:
    assert "no role writes" in forged_metric(TOPICS.metrics("trainer"), metric("made.up"))
    assert forged_metric(TOPICS.metrics(ADMIN), metric("made.up")) is None


@pytest.mark.parametrize("kind", ["trajectories", "samples", "tasks", "feedback", "weights", ""])
def test_a_dead_letter_is_a_fate_only_from_a_role_that_reads_its_topic(kind: str) -> None:
    named = {
        "trajectories": TOPICS.trajectories("main"),
        "samples": TOPICS.samples("main"),
        "tasks": TOPICS.tasks(),
        "feedback": TOPICS.feedback(),
        "weights": TOPICS.weights("main"),
        "": "",
    }[kind]
    for role in CONTROL_ROLES:
        reason = forged_letter("r", TOPICS.deadletter(role), letter(named))
        assert (reason is None) == (role in LETTER_WRITERS[kind] or role == ADMIN), (role, kind, reason)


def test_a_dead_letter_of_another_run_or_of_the_metrics_is_forged_unless_admin_wrote_it() -> None:
    for topic in ("other.trajectories.main", TOPICS.metrics("trainer"), TOPICS.ledger("main")):
        assert forged_letter("r", TOPICS.deadletter("stream"), letter(topic)) is not None
        assert forged_letter("r", TOPICS.deadletter(ADMIN), letter(topic)) is None


def test_a_component_writes_its_roles_topics(tmp_path: Path) -> None:
    config = parse_config({"run": "r"})
    for component, role in (("train", "trainer"), ("rollout", "producer"), ("launcher", ADMIN)):
        ctx = ComponentContext(config, tmp_path / component, component)
        try:
            ctx.metric("train.loss", 1.0, 1)
            ctx.dead_letter(None, "why")
            ctx.producer.flush()
            ends = {topic: sum(ctx.log.end_offsets(topic).values()) for topic in TOPICS.metrics_topics()}
            assert ends[TOPICS.metrics(role)] >= 1 and sum(ends.values()) == ends[TOPICS.metrics(role)]
            assert sum(ctx.log.end_offsets(TOPICS.deadletter(role)).values()) >= 1
        finally:
            ctx.close()


def test_the_monitor_stops_on_genuine_figures_and_reports_each_forgery(tmp_path: Path) -> None:
    """The embedded log has no principals, but the topic still names the writer: a producer writing
    the evaluator's accuracy on its own topic moves nothing, and the launcher is told."""
    config = parse_config({"run": "r", "stop": {"target_accuracy": 0.9, "max_versions": 3}})
    producer, evaluator = (ComponentContext(config, tmp_path, name) for name in ("rollout", "evaluate"))
    reported: list[str] = []
    try:
        producer.metric("eval.accuracy", 1.0, 1, policy="main")
        producer.metric("train.version", 1e6, 1e6, policy="main")
        evaluator.metric("eval.accuracy", 0.4, 0, policy="main")
        for context in (producer, evaluator):
            context.producer.flush()
        with open_log("embedded", path=tmp_path / "log.sqlite") as log:
            monitor = RunMonitor(config, tmp_path, log, TOPICS, report=lambda message, why: reported.append(why))
            monitor._consume(timeout=1.0)
            assert monitor.done() is None and monitor.accuracy == {0: 0.4} and monitor.version == 0
            assert dict(monitor.forgeries) == {"metrics": 2} and len(reported) == 2
            monitor.close()
    finally:
        for context in (producer, evaluator):
            context.close()
