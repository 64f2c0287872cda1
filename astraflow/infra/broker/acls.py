"""What each component role may do on one run's topics, as Kafka ACLs for the secure broker.

One principal per role (``config.log.ROLES``; ``log.security.role_credentials`` makes each
component log in as its own); ``admin`` is a super user and creates the run's topics
and writes the schema topic. Every other principal may do only this on run ``r`` (topics by exact
name, consumer groups and transactional ids by prefix):

=========  ==========================================  ============================================
role       reads                                       writes
=========  ==========================================  ============================================
feeder     tasks, feedback, weights (versions only)     tasks; transactional ids ``r.feed.``
producer   tasks, weights                               trajectories; groups and transactional ids
                                                        ``r.rollout.``
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astraflow.config.log import ROLES
from astraflow.log.base import ASSIGN_GROUP_PREFIX
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.store import SCHEMA_TOPIC


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
        "producer": {"read": [topics.tasks(), *weights], "write": [topics.trajectories(p) for p in policies]},
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
