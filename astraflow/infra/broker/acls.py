"""What each component role may do on one run's topics, as Kafka ACLs for the secure broker.

One principal per role (``config.log.ROLES``; ``log.security.role_credentials`` makes each
component log in as its own); ``admin`` is a super user and creates the run's topics
and writes the schema topic. Every other principal may do only this on run ``r`` (topics by exact
name, consumer groups and transactional ids by prefix):

=========  ==========================================  ============================================
role       reads                                       writes
=========  ==========================================  ============================================
feeder     tasks, feedback, weights (versions only)     tasks; transactional ids ``r.feed.``
producer   tasks, weights, episodes                     trajectories, episodes; groups and
                                                        transactional ids ``r.rollout.``
stream     trajectories, tasks, weights, its changelogs samples, feedback, topics ``r.stream.``
                                                        (its changelogs; faust creates its own);
                                                        groups and transactional ids ``r.stream.``
trainer    samples, its ledger, weights                 weights (and deletes old versions), ledger,
                                                        feedback; group and transactional ids
                                                        ``r.train.``
evaluator  weights                                      -
scaler     every metrics topic, samples; the trainer       -
           group's offsets
analysis   every topic of the run                       nothing; groups ``r.analysis.``
=========  ==========================================  ============================================

and every role but ``analysis`` writes its own ``r.metrics.ROLE`` and ``r.deadletter.ROLE`` and no
other role's (readers believe a metric or a dead letter only from the role allowed to write it:
``runtime/control.py``); every role reads the schema topic and describes (metadata and configs)
the run's topics.

ACLs bound what a principal may touch, not how fast: a producer flooding its trajectories topic
would take the broker's disk and network threads from the trainer and everyone else. So each
principal also has client quotas (``DEFAULT_QUOTAS``), which ``astraflow broker start --secure``
sets and ``astraflow broker quotas`` shows and changes: principals, unlike runs, belong to the
cluster, so its quotas do too (``broker grant`` and ``astraflow run`` leave them alone).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.config.log import ADMIN, ROLES
from astraflow.core.errors import BrokerError
from astraflow.log.base import ASSIGN_GROUP_PREFIX
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.store import SCHEMA_TOPIC

if TYPE_CHECKING:
    from astraflow.infra.broker.secure import SecurityFiles


@dataclass(frozen=True)
class Grant:
    """One ACL: ``principal`` may ``operation`` on the ``kind`` resource ``name`` (exact or prefix)."""

    principal: str
    kind: str  # "topic" | "group" | "transactional_id"
    name: str
    operation: str  # "read" | "write" | "describe" | "create" | "delete" | "describe_configs"
    prefixed: bool = False


def run_grants(topics: RunTopics) -> list[Grant]:
    """Every ACL the component roles need for the run of ``topics`` (the module docstring's table)."""
    run, policies = topics.run, topics.policies
    weights = [topics.weights(p) for p in policies]
    per_role: dict[str, dict[str, list[str]]] = {
        "feeder": {"read": [topics.tasks(), topics.feedback(), *weights], "write": [topics.tasks()]},
        "producer": {
            "read": [topics.tasks(), *weights, *(topics.episodes(p) for p in policies)],
            "write": [*(topics.trajectories(p) for p in policies), *(topics.episodes(p) for p in policies)],
        },
        "stream": {
            "read": [*(topics.trajectories(p) for p in policies), topics.tasks(), *weights],
            "write": [*(topics.samples(p) for p in policies), topics.feedback()],
        },
        "trainer": {
            "read": [*(topics.samples(p) for p in policies), *(topics.ledger(p) for p in policies), *weights],
            "write": [*weights, *(topics.ledger(p) for p in policies), topics.feedback()],
            "delete": weights,
        },
        "evaluator": {"read": weights, "write": []},
        "scaler": {"read": [*topics.metrics_topics(), *(topics.samples(p) for p in policies)], "write": []},
        "analysis": {"read": [spec.name for spec in topics.specs(1)], "write": []},
    }
    prefixes = {
        "feeder": {"transactional_id": [f"{run}.feed."], "group": [f"{run}.feed."]},
        "producer": {"transactional_id": [f"{run}.rollout."], "group": [f"{run}.rollout."]},
        "stream": {"transactional_id": [f"{run}.stream."], "group": [f"{run}.stream."], "topic": [f"{run}.stream."]},
        "trainer": {"transactional_id": [f"{run}.train."], "group": [f"{run}.train."]},
        "evaluator": {"group": [f"{run}.eval."]},
        "scaler": {"group": [f"{run}.train."]},
        "analysis": {"group": [f"{run}.analysis."]},
    }
    grants: list[Grant] = []
    everything = [spec.name for spec in topics.specs(1)]
    for role in ROLES:
        rights = per_role[role]
        writes = list(rights["write"])
        if role != "analysis":
            writes += [topics.metrics(role), topics.deadletter(role)]
        grants += [Grant(role, "topic", SCHEMA_TOPIC, op) for op in ("read", "describe", "describe_configs")]
        # a reader without a group (assign only) still has a throwaway one: librdkafka looks its coordinator up
        grants += [Grant(role, "group", ASSIGN_GROUP_PREFIX, op, prefixed=True) for op in ("read", "describe")]
        grants += [Grant(role, "topic", name, op) for name in everything for op in ("describe", "describe_configs")]
        grants += [Grant(role, "topic", name, "read") for name in dict.fromkeys(rights["read"])]
        grants += [Grant(role, "topic", name, "write") for name in dict.fromkeys(writes)]
        grants += [Grant(role, "topic", name, "delete") for name in rights.get("delete", [])]
        for kind, names in prefixes[role].items():
            operations = {
                "transactional_id": ("write", "describe"),
                "group": ("read", "describe"),
                "topic": ("read", "write", "create", "describe", "describe_configs"),
            }[kind]
            grants += [Grant(role, kind, name, op, prefixed=True) for name in names for op in operations]
    return grants


def acl_bindings(grants: list[Grant]) -> list[Any]:
    """The confluent-kafka ``AclBinding``s of ``grants`` (allow, from any host)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional_id": ResourceType.TRANSACTIONAL_ID,
    }
    return [
        AclBinding(
            kinds[grant.kind],
            grant.name,
            ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL,
            f"User:{grant.principal}",
            "*",
            getattr(AclOperation, grant.operation.upper()),
            AclPermissionType.ALLOW,
        )
        for grant in grants
    ]


def grant_run(admin_config: dict[str, Any], topics: RunTopics, timeout_s: float = 30.0) -> int:
    """Create the run's ACLs (``run_grants``) on the cluster, as the admin principal of
    ``admin_config`` (librdkafka settings with ``bootstrap.servers``); returns how many."""
    from confluent_kafka.admin import AdminClient

    from astraflow.core.errors import BrokerError

    bindings = acl_bindings(run_grants(topics))
    admin = AdminClient(admin_config)  # held until every future is done: its handle serves them
    futures = admin.create_acls(bindings, request_timeout=timeout_s)
    for binding, future in futures.items():
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001 - a KafkaException carries the broker's reason
            raise BrokerError(f"creating the ACL {binding} failed: {exc}") from exc
    return len(bindings)


# --- client quotas per principal ---

QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")
"""Kafka's user quotas: bytes a second written, bytes a second read (each per broker), and the share
of the broker's network and I/O threads' time (100 = one thread's) its requests may take."""
_MIB = 1024 * 1024
DEFAULT_QUOTAS: dict[str, dict[str, float]] = {
    # writes the prompts (small); reads tasks, feedback and which weight versions exist
    "feeder": {"producer_byte_rate": 4 * _MIB, "consumer_byte_rate": 16 * _MIB, "request_percentage": 50},
    # every rollout worker shares it: trajectories out (tokens and log-probs); every new weight
    # version in, once per worker
    "producer": {"producer_byte_rate": 32 * _MIB, "consumer_byte_rate": 512 * _MIB, "request_percentage": 200},
    # as much out (samples, feedback, its changelogs) as trajectories in, and the weights' versions
    "stream": {"producer_byte_rate": 64 * _MIB, "consumer_byte_rate": 128 * _MIB, "request_percentage": 200},
    # publishes every weight version (chunks of up to 16 MiB) and reads samples and, on resume, weights
    "trainer": {"producer_byte_rate": 256 * _MIB, "consumer_byte_rate": 256 * _MIB, "request_percentage": 300},
    # reads every weight version; writes its metrics only
    "evaluator": {"producer_byte_rate": 1 * _MIB, "consumer_byte_rate": 256 * _MIB, "request_percentage": 100},
    # reads metrics and the samples topic's offsets; writes its metrics only
    "scaler": {"producer_byte_rate": 1 * _MIB, "consumer_byte_rate": 16 * _MIB, "request_percentage": 50},
    # reads anything of a run (tail, export, audit) but must not starve the run doing it; writes nothing
    "analysis": {"producer_byte_rate": 1 * _MIB, "consumer_byte_rate": 64 * _MIB, "request_percentage": 100},
}
"""Each role's quotas: ceilings a healthy run stays well under, sized by what the role moves (the
trainer publishes weights, producers and the evaluator read them, analysis only reads), so a flooding
principal is slowed (the broker delays its responses) before it can take the broker from the others.
A principal's quota is shared by all its clients (every rollout worker is ``producer``) and holds on
each broker, so a cluster of three gives it up to three times as much. ``admin`` has none: it
creates topics and grants, and a super user is trusted anyway."""

QUOTAS_FILE = "client-quotas.txt"
"""What ``broker secure-config`` writes for the compose stack's quotas one shot (``quota_lines``)."""

QuotaChanges = dict[str, dict[str, float | None]]
"""Per principal, the quotas to set (``None``: remove that one, so no limit)."""


def parse_quota(text: str) -> QuotaChanges:
    """``PRINCIPAL:key=value,...`` (``--quota``, ``--set``) as changes: bytes a second for the byte
    rates, percent of one thread for ``request_percentage``; ``key=`` (no value) removes that quota."""
    principal, colon, items = text.partition(":")
    if not colon or not items:
        raise BrokerError(
            f"quota {text!r}: expected PRINCIPAL:key=value[,key=value] (e.g. producer:producer_byte_rate=1048576)"
        )
    if principal not in (ADMIN, *ROLES):
        raise BrokerError(f"quota {text!r}: no principal {principal!r}; one of {', '.join((ADMIN, *ROLES))}")
    changes: dict[str, float | None] = {}
    for item in items.split(","):
        key, equals, value = item.strip().partition("=")
        if key not in QUOTA_KEYS or not equals:
            raise BrokerError(f"quota {text!r}: {item!r} is not key=value with a key of {', '.join(QUOTA_KEYS)}")
        if not value:
            changes[key] = None
            continue
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not number > 0 or number == float("inf"):
            raise BrokerError(f"quota {text!r}: {key} must be a positive number (or empty to remove it), not {value!r}")
        changes[key] = number
    return {principal: changes}


def parse_quotas(texts: list[str]) -> QuotaChanges:
    """Every ``--quota`` given, the later over the earlier (``parse_quota``, ``merged_quotas``)."""
    return merged_quotas(*(parse_quota(text) for text in texts))


def quota_lines(quotas: dict[str, dict[str, float]]) -> str:
    """A line per principal, ``PRINCIPAL key=value,...``: what ``kafka-configs.sh --alter --entity-type users
    --entity-name PRINCIPAL --add-config`` takes, for where only Kafka's own tools run (the compose stack)."""
    return "".join(
        f"{principal} " + ",".join(f"{key}={value:.0f}" for key, value in values.items()) + "\n"
        for principal, values in quotas.items()
    )


def merged_quotas(*changes: QuotaChanges) -> QuotaChanges:
    """``changes`` one over the other, key by key (a later ``--quota`` for a principal overrides only
    the quotas it names)."""
    merged: QuotaChanges = {}
    for change in changes:
        for principal, quotas in change.items():
            merged.setdefault(principal, {}).update(quotas)
    return merged


def set_quotas(
    libs_dir: Path,
    bootstrap: str,
    files: "SecurityFiles",
    fill: QuotaChanges | None = None,
    replace: QuotaChanges | None = None,
    timeout_s: float = 90.0,
) -> dict[str, dict[str, float]]:
    """As ``admin``: give each principal of ``fill`` those quotas if it has none yet (so a restart
    keeps what was changed since), then set those of ``replace`` whatever it has; return every
    principal's quotas as the cluster then describes them (checked to hold what was set).

    Through Kafka's Java admin client and the broker's jars in ``libs_dir``, because confluent-kafka
    has no client quota API (librdkafka implements none of the requests) and ``kafka-configs.sh``
    changes one user per JVM start (seconds each): ``ClientQuotas.java`` (package data) runs once, from
    source (Java's source launcher, a JDK's), for all of them."""
    from astraflow.infra.broker.host import java
    from astraflow.infra.broker.secure import write_private
    from astraflow.infra.broker.settings import properties_text

    arguments: list[str] = []
    for mode, changes in (("--fill", fill or {}), ("--set", replace or {})):
        arguments.append(mode)
        for principal, quotas in changes.items():
            items = ",".join(f"{key}={'' if value is None else repr(float(value))}" for key, value in quotas.items())
            if items:
                arguments.append(f"{principal}:{items}")
    settings = {
        "bootstrap.servers": bootstrap,
        **files.java_client_properties(ADMIN),
        "request.timeout.ms": "15000",
        "default.api.timeout.ms": str(int(timeout_s * 1000 * 2 / 3)),
    }
    with tempfile.TemporaryDirectory(prefix="astraflow-quotas-") as work:  # mode 0700: the password is in it
        source, properties = Path(work) / "ClientQuotas.java", Path(work) / "admin.properties"
        source.write_bytes(resources.files(__package__).joinpath(source.name).read_bytes())
        write_private(properties, properties_text(settings).encode())
        command = [java(), "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{libs_dir}/*"]
        try:
            done = subprocess.run(
                [*command, str(source), str(properties), *arguments], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"setting the client quotas on {bootstrap} took over {timeout_s:.0f}s") from exc
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        hint = " (Java's source launcher needs a JDK, not a JRE alone)" if "jdk.compiler" in output else ""
        raise BrokerError(
            f"setting the client quotas on {bootstrap} as admin failed{hint} (the broker runs without them until"
            f" `astraflow broker quotas --defaults` sets them):\n{output}"
        )
    described: dict[str, dict[str, float]] = {}
    for line in done.stdout.splitlines():
        principal, *items = line.split("\t")
        described[principal] = {key: float(value) for key, value in (item.split("=", 1) for item in items)}
    return described
