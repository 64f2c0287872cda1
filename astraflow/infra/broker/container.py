"""The secure Kafka nodes of the compose stack: ``astraflow broker secure-config`` writes, into one
directory (the stack's ``security`` volume), everything they and their clients need.

``docker-compose.secure.yml`` runs it once before the nodes start. It writes the same files and
node settings as ``astraflow broker start --secure`` (``secure.SecurityFiles``,
``settings.node_settings``), only for containers: each node binds every interface of its container
and is advertised by its hostname, the node certificate names every hostname, and a second SASL_SSL
listener takes clients outside the container network (the host, through a published port).
In ``OUT``:

- ``ca.pem``, ``ca.key``, ``node.pem``, ``<principal>.password``: as in a secure broker home;
- ``<host>/server.properties`` per node: no secret in it;
- ``format.args``: the ``kafka-storage format`` arguments that create every principal's SCRAM
  credential, one a line (passwords: mode 0600);
- ``admin-client.properties``: the admin's settings for Kafka's command-line tools (the
  healthcheck's ``--command-config``; password: mode 0600);
- ``log-security.yaml``: the ``log.security`` section of the AstraFlow services, which log in as
  their roles (``role_credentials``); it names files and holds no secret;
- ``client-quotas.txt``: each role's default client quotas (``acls.DEFAULT_QUOTAS``), which the
  compose stack's ``quotas`` one-shot sets on the cluster (no secret).

It is idempotent: a second run keeps the CA and the passwords (the SCRAM credentials formatted into
the nodes' storage depend on them) and rewrites the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from astraflow.core.errors import BrokerError
from astraflow.infra.broker.secure import LOOPBACK, NodeAddress, SecurityFiles, write_private
from astraflow.infra.broker.settings import node_settings, properties_text

FORMAT_ARGS = "format.args"
ADMIN_CLIENT = "admin-client.properties"
LOG_SECURITY = "log-security.yaml"
PROPERTIES = "server.properties"


@dataclass(frozen=True)
class ContainerNodes:
    """The secure nodes of a container network: one per host name, node ids 1, 2, ... in order."""

    hosts: tuple[str, ...]
    port: int = 9092
    """Client port (SASL_SSL) inside the network."""
    internal_port: int = 9091
    controller_port: int = 9093
    external: tuple[str, ...] = ()
    """Per host, the ``host:port`` clients outside the network reach it at (a published port); none if empty."""
    external_port: int = 9094
    """The container port of the ``external`` listener (what the published port maps to)."""
    bind: str = "0.0.0.0"
    data_dir: str = "/var/lib/kafka/data"

    def __post_init__(self) -> None:
        if not self.hosts:
            raise BrokerError("--hosts: name at least one node")
        if len(set(self.hosts)) != len(self.hosts):
            raise BrokerError(f"--hosts: a host is named twice in {','.join(self.hosts)}")
        if self.external and len(self.external) != len(self.hosts):
            raise BrokerError(
                f"--external: {len(self.external)} addresses for {len(self.hosts)} hosts; give one per host, in order"
            )
        for address in self.external:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise BrokerError(f"--external: {address!r} is not host:port")

    @property
    def replicas(self) -> int:
        """Three replicas of every partition where there are three nodes (two in sync), else one per node."""
        return min(3, len(self.hosts))

    def certificate_hosts(self) -> tuple[str, ...]:
        """Every name a client may reach a node by: the hosts, the external hosts, and loopback."""
        external = [address.rpartition(":")[0] for address in self.external]
        return tuple(dict.fromkeys([*self.hosts, *external, *LOOPBACK]))

    def address(self, index: int) -> NodeAddress:
        return NodeAddress(
            self.port,
            self.controller_port,
            self.internal_port,
            host=self.hosts[index],
            bind=self.bind,
            external=(self.external_port, self.external[index]) if self.external else None,
        )

    def settings(self, files: SecurityFiles) -> dict[str, dict[str, str]]:
        """Per host, its node's ``server.properties`` entries (``settings.node_settings``)."""
        voters = {n: f"{host}:{self.controller_port}" for n, host in enumerate(self.hosts, start=1)}
        return {
            host: node_settings(n, voters, self.address(n - 1), self.data_dir, self.replicas, files)
            for n, host in enumerate(self.hosts, start=1)
        }


def write_secure_config(out: Path, nodes: ContainerNodes, owner: tuple[int, int] | None = None) -> SecurityFiles:
    """Write the security files and every node's configuration into ``out`` (the module docstring);
    with ``owner`` (uid, gid), hand all of it to that user: the Kafka image runs as its own user,
    which must read the node key and the passwords that only their owner may."""
    files = SecurityFiles(Path(out), nodes.certificate_hosts()).make()
    for host, settings in nodes.settings(files).items():
        (files.directory / host).mkdir(exist_ok=True)
        (files.directory / host / PROPERTIES).write_text(properties_text(settings))
    write_private(files.directory / FORMAT_ARGS, "".join(f"{arg}\n" for arg in files.scram_arguments()).encode())
    write_private(files.directory / ADMIN_CLIENT, properties_text(files.java_client_properties("admin")).encode())
    (files.directory / LOG_SECURITY).write_text(yaml.safe_dump(files.role_security(), sort_keys=False))
    if owner is not None:
        _chown_tree(files.directory, *owner)
    return files


def parse_owner(text: str) -> tuple[int, int]:
    """``UID:GID`` (or ``UID``, the group then the same number) as two integers."""
    uid, _, gid = text.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise BrokerError(f"--owner: {text!r} is not UID:GID in numbers (the Kafka image's user is 1000:1000)")
    return int(uid), int(gid or uid)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    try:
        os.chown(root, uid, gid)
        for directory, subdirectories, names in os.walk(root):
            for name in [*subdirectories, *names]:
                os.chown(Path(directory) / name, uid, gid)
    except PermissionError as exc:
        raise BrokerError(f"--owner {uid}:{gid}: cannot hand {exc.filename} over (only root may): {exc}") from exc
