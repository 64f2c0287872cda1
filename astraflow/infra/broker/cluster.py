"""Several local KRaft nodes on loopback as one cluster: the durable profile of the dev broker.

``astraflow broker start --nodes 3`` runs three nodes, each broker and controller, in
``HOME/node1`` ... ``HOME/node3``, on client ports ``port`` ... ``port + 2`` (9092-9094 by default)
and a controller port each. Every topic gets three replicas, two of which must hold a write
before ``acks=all`` acknowledges it (``min.insync.replicas``), and the internal topics (consumer
offsets, transaction state) are replicated the same way. So a record acknowledged to a producer
survives the loss of any one node, and the cluster goes on serving with two.

``cluster.json`` in the home keeps the cluster id and ports of the first start; later starts and
``stop`` and ``status`` read it. Each node is a ``LocalKafkaBroker`` and keeps its own data, log
and pid in its folder.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from astraflow.core.errors import BrokerError
from astraflow.core.ports import free_port
from astraflow.infra.broker.host import new_cluster_id
from astraflow.infra.broker.jars import KAFKA_VERSION
from astraflow.infra.broker.local import DEFAULT_PORT, LocalKafkaBroker
from astraflow.infra.broker.secure import SecurityFiles

META = "cluster.json"


@dataclass(frozen=True)
class ClusterStatus:
    """What ``LocalKafkaCluster.status`` found: per node id, its pid while it runs."""

    pids: dict[int, int | None]
    bootstrap: str
    home: Path

    @property
    def running(self) -> int:
        return sum(pid is not None for pid in self.pids.values())


class LocalKafkaCluster:
    """``nodes`` KRaft nodes on 127.0.0.1 with ``min(nodes, 3)`` replicas per partition."""

    def __init__(
        self,
        home: Path,
        nodes: int | None = None,
        port: int | None = None,
        *,
        jar_cache: Path | None = None,
        version: str = KAFKA_VERSION,
        heap: str = "512m",
        secure: bool | None = None,
    ) -> None:
        self.home = Path(home).expanduser().resolve()
        saved = json.loads((self.home / META).read_text()) if (self.home / META).exists() else {}
        count = nodes or saved.get("nodes") or 3
        if saved and saved["nodes"] != count:
            raise BrokerError(
                f"the cluster in {self.home} has {saved['nodes']} nodes, not {count}: use --home for another one"
            )
        if count < 2:
            raise BrokerError("a cluster needs at least 2 nodes; one node is `astraflow broker start` without --nodes")
        first = port or saved.get("port") or DEFAULT_PORT
        controllers = {int(n): p for n, p in saved.get("controller_ports", {}).items()}
        if not controllers:  # distinct, and none of the client ports
            taken = set(range(first, first + count))
            for n in range(1, count + 1):
                controllers[n] = free_port(avoid=taken)
                taken.add(controllers[n])
        self.cluster_id: str = saved.get("cluster_id") or new_cluster_id()
        self.meta = {"cluster_id": self.cluster_id, "nodes": count, "port": first, "controller_ports": controllers}
        if secure and saved and not saved.get("secure"):
            raise BrokerError(f"the cluster in {self.home} was made without --secure: use --home for a secure one")
        secure = secure or bool(saved.get("secure"))  # a secure home stays secure
        self.security = SecurityFiles(self.home / "security").make() if secure else None
        internal = {int(n): p for n, p in saved.get("internal_ports", {}).items()}
        if secure:
            if not internal:
                taken = set(range(first, first + count)) | set(controllers.values())
                for n in range(1, count + 1):
                    internal[n] = free_port(avoid=taken)
                    taken.add(internal[n])
            self.meta.update({"secure": True, "internal_ports": internal})
        self.nodes = [
            LocalKafkaBroker(
                self.home / f"node{n}",
                first + n - 1,
                controllers[n],
                jar_cache=jar_cache,
                version=version,
                heap=heap,
                node_id=n,
                cluster_id=self.cluster_id,
                voters=controllers,
                replicas=min(count, 3),
                security=self.security,
                internal_port=internal.get(n),
            )
            for n in range(1, count + 1)
        ]

    @property
    def version(self) -> str:
        return self.nodes[0].version

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, so a client finds the cluster with any node down."""
        return ",".join(node.bootstrap for node in self.nodes)

    def client_config(self, principal: str = "admin") -> dict[str, str]:
        """librdkafka settings a client needs besides the bootstrap (``LocalKafkaBroker.client_config``)."""
        return self.nodes[0].client_config(principal)

    def start(self, timeout: float = 90.0) -> None:
        """Launch every node that does not run, then wait until each serves."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / META).write_text(json.dumps(self.meta, indent=2) + "\n")
        launched = [(node, node.launch()) for node in self.nodes]
        for node, proc in launched:
            if proc is not None:
                node.wait_serving(proc, timeout)

    def node(self, node_id: int) -> LocalKafkaBroker:
        return self.nodes[node_id - 1]

    def status(self) -> ClusterStatus:
        return ClusterStatus({n.node_id: n.status().pid for n in self.nodes}, self.bootstrap, self.home)

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node (a controlled shutdown each) at once; False if none ran.

        At once, not one after the other: a node's controlled shutdown needs a quorum of
        controllers, which the last node of a one-by-one stop no longer has."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            return any(list(pool.map(lambda node: node.stop(timeout), self.nodes)))

    def __enter__(self) -> "LocalKafkaCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def is_cluster_home(home: Path) -> bool:
    """Whether ``home`` holds a cluster (``cluster.json``) rather than a single node."""
    return (Path(home).expanduser() / META).exists()
