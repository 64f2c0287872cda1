"""A KRaft node's ``server.properties``: one definition for every way AstraFlow runs a broker.

``LocalKafkaBroker`` (one node, or a node of ``LocalKafkaCluster``) and the compose stack's secure
variant (``astraflow broker secure-config``, ``container.py``) both write ``node_settings``, so
the durability settings (replicas, in-sync replicas) and the security settings
(``secure.server_settings``) cannot drift apart between them; only the addresses differ.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.infra.broker.secure import NodeAddress, SecurityFiles, server_settings

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Weight chunks are up to 16 MiB (``TopicSpec.max_message_bytes``): the broker and its replica
fetchers must carry them."""


def node_settings(
    node_id: int,
    voters: dict[int, str],
    address: NodeAddress,
    data_dir: Path | str,
    replicas: int = 1,
    security: SecurityFiles | None = None,
) -> dict[str, str]:
    """Every ``server.properties`` entry of node ``node_id`` (broker and controller).

    ``voters`` maps each controller's node id to its ``host:port``; topics get ``replicas``
    replicas, of which ``min(2, replicas)`` must hold an ``acks=all`` write. With ``security`` the
    node is secure (``secure.server_settings``): no PLAINTEXT listener is left.
    """
    replication, in_sync = str(replicas), str(min(2, replicas))
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(f"{n}@{voter}" for n, voter in sorted(voters.items())),
        "listeners": f"PLAINTEXT://{address.bind}:{address.port},CONTROLLER://{address.bind}:{address.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{address.host}:{address.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": replication,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": in_sync,
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": in_sync,
        # topics made without a replication factor (every topic of a run) get ``replicas``, and
        # an acks=all write is acknowledged once ``in_sync`` of them hold it
        "default.replication.factor": replication,
        "min.insync.replicas": in_sync,
        "replica.fetch.max.bytes": str(MAX_MESSAGE_BYTES),
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "message.max.bytes": str(MAX_MESSAGE_BYTES),
    }
    if security is not None:
        settings.update(server_settings(security, address))
    return settings


def properties_text(settings: dict[str, str]) -> str:
    """``settings`` as a Java properties file, one ``key=value`` a line, in order."""
    return "".join(f"{key}={value}\n" for key, value in settings.items())
