"""Who may write what on a run's control plane: its metrics and its dead letters.

Metrics steer a run (the launcher's stop rule and ``summary.json`` believe ``eval.accuracy`` and
``train.version``, its producer pool follows ``scaler.desired_producers``, the scaler follows the
trainer's waits) and dead letters are records' fates (``astraflow audit``). So each role writes them
to topics of its own, ``{run}.metrics.{role}`` and ``{run}.deadletter.{role}``, which on the secure
broker only that role's principal may write (``infra/broker/acls.py``): the topic a record came
from names its writer. A reader acts on a record only when that writer is allowed to say it:

- a metric belongs to the role its name's prefix names (``METRIC_OWNERS``: ``eval.`` the
  evaluator, ``train.`` the trainer, ...);
- a dead letter is the fate of a record only when written by a role that reads that record's topic
  (``LETTER_WRITERS``: a trajectory's by the stream, a sample's by the trainer, ...).

Anything else is a forgery: counted, reported by the launcher as a dead letter of its own naming
the forger's topic and offset, and never acted on. ``admin`` (the launcher) is a super user on the
broker, able to write every topic anyway, so what it writes is believed.

The embedded log has no principals: every process that can open its file can write every topic,
so there these checks catch a component that writes what is not its to write (a bug), not an
attacker (docs/security.md, "Threat model").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from astraflow.config.log import ADMIN
from astraflow.core.errors import clip
from astraflow.core.metric_names import ROLLOUT_PREFIX, TRAIN_PREFIX
from astraflow.runtime.attach import AttachedRun, decode_snapshot
from astraflow.schemas.records import DeadLetter, Metric
from astraflow.schemas.validation import letter_problem, metric_problem

METRIC_OWNERS = {
    "feeder.": "feeder",
    ROLLOUT_PREFIX: "producer",
    "stream.": "stream",
    TRAIN_PREFIX: "trainer",
    "eval.": "evaluator",
    "scaler.": "scaler",
    "launcher.": ADMIN,
}
"""The role allowed to write each metric name prefix (``core/metric_names.py`` groups names so)."""

FOLLOWERS = frozenset({"feeder", "producer", "stream", "trainer", "evaluator"})
LETTER_WRITERS = {
    "trajectories": frozenset({"stream"}),
    "samples": frozenset({"trainer"}),
    "tasks": frozenset({"producer"}),
    "feedback": frozenset({"feeder"}),
    "weights": FOLLOWERS,
    "": FOLLOWERS,
}
"""Per kind of the run's topics, the roles that read it and so may dead-letter its records; ``""``:
dead letters of no record (a workflow that failed before writing anything, a dataset row the feeder
cannot submit), counted by reason but the fate of no record."""


def writer(topic: str) -> str:
    """The role whose topic ``topic`` (``{run}.metrics.{role}`` or ``{run}.deadletter.{role}``) is."""
    return topic.rsplit(".", 1)[1]


def metric_owner(name: str) -> str | None:
    """The role allowed to write metric ``name``, or ``None`` for a name no role owns."""
    return next((role for prefix, role in METRIC_OWNERS.items() if name.startswith(prefix)), None)


def forged_metric(topic: str, metric: Metric) -> str | None:
    """Why ``metric``, read from ``topic``, is not to be believed - malformed (``metric_problem``), or not
    its writer's to write - or ``None`` when it is."""
    name = clip(metric.name, 64)
    problem = metric_problem(metric)
    if problem is not None:
        return f"metric {name!r} on {topic}: malformed: {problem}"
    role = writer(topic)
    owner = metric_owner(metric.name)
    if role == ADMIN or owner == role:
        return None
    if owner is None:
        return f"metric {name!r} on {topic}: no role writes metrics of that name"
    return f"metric {name!r} on {topic}: only the {owner} role writes {metric.name.split('.')[0]}.* metrics"


def topic_kind(run: str, topic: str) -> str | None:
    """The kind of run topic ``topic`` names (``trajectories``, ``samples``, ...; ``""`` for none),
    or ``None`` for a topic of another run."""
    if not topic:
        return ""
    if not topic.startswith(f"{run}."):
        return None
    return topic.removeprefix(f"{run}.").split(".", 1)[0]


def forged_letter(run: str, topic: str, letter: DeadLetter) -> str | None:
    """Why ``letter``, read from ``topic``, is not to be believed - malformed (``letter_problem``), or not
    its writer's to write - or ``None`` when it is."""
    problem = letter_problem(letter)
    if problem is not None:
        return f"dead letter on {topic}: malformed: {problem}"
    role = writer(topic)
    if role == ADMIN:
        return None
    kind = topic_kind(run, letter.topic)
    if kind is not None and role in LETTER_WRITERS.get(kind, frozenset()):
        return None
    where = f"{letter.topic}[{letter.partition}]@{letter.offset}" if letter.topic else "no record"
    return f"dead letter of {where} on {topic}: the {role} role does not read that topic"


@dataclass
class ControlRecords:
    """A run's metrics and dead letters as its readers take them: those their writers may write, and
    the reasons of the rest (``forged``), which no reader acts on."""

    metrics: list[Metric] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    forged: list[str] = field(default_factory=list)


def read_control(run: AttachedRun, metrics: bool = True, letters: bool = True) -> ControlRecords:
    """Every role's metrics (with ``metrics``) and dead letters (with ``letters``) of ``run`` now,
    sorted by creation time, split by ``forged_metric`` and ``forged_letter``."""
    found = ControlRecords()
    for topic in run.topics_of("metrics") if metrics else []:
        for _, record in decode_snapshot(run.log, topic):
            if not isinstance(record, Metric):
                continue
            reason = forged_metric(topic, record)
            if reason is None:
                found.metrics.append(record)
            else:
                found.forged.append(reason)
    for topic in run.topics_of("deadletter") if letters else []:
        for _, record in decode_snapshot(run.log, topic):
            if not isinstance(record, DeadLetter):
                continue
            reason = forged_letter(run.name, topic, record)
            if reason is None:
                found.letters.append(record)
            else:
                found.forged.append(reason)
    found.metrics.sort(key=lambda metric: metric.created_ms)
    found.letters.sort(key=lambda letter: letter.created_ms)
    return found
