"""A local Apache Kafka broker (KRaft) run from the jars on Maven Central: one node, or one node of
a ``LocalKafkaCluster`` (``cluster.py``).

A single node keeps one replica of every partition, so ``acks=all`` means written once, to one
disk: it is a development broker, not a durable one. ``astraflow broker start --nodes 3`` runs the
durable profile instead (three replicas, two in sync before a write is acknowledged).

Why not a download of the Kafka tarball or Docker: Java 17 and Maven are all a development
machine or CI runner needs; Maven resolves the exact broker jars once into a cache and every
later start is offline. The broker runs as a detached JVM in its own process group, so it
outlives the command that started it and ``astraflow broker stop`` (or ``LocalKafkaBroker.stop``)
ends it from any process.

A broker home holds::

    libs-<version>/     the jars (``kafka_jars``; in ``jar_cache``, which defaults to the home)
    data/               KRaft metadata and topic partitions, formatted once, kept across restarts
    broker.json         cluster id and ports chosen at the first start, reused by later ones
    server.properties   written at each start
    broker.pid          the JVM's pid while it runs
    broker.log          the JVM's stdout/stderr: warnings and errors only (truncated at each start)
    logs/server.log     the full INFO log, rolled at 3 x 10 MiB
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from astraflow.core.errors import BrokerError
from astraflow.core.ports import free_port, port_free
from astraflow.infra.broker import host
from astraflow.infra.broker.host import is_kafka_process, listening, new_cluster_id, tail, wait_exit
from astraflow.infra.broker.jars import KAFKA_VERSION, fetch_jars
from astraflow.infra.broker.secure import NodeAddress, SecurityFiles
from astraflow.infra.broker.settings import node_settings, properties_text

logger = logging.getLogger(__name__)

DEFAULT_PORT = 9092
_LOG4J = "kafka-log4j2.xml"


def default_home() -> Path:
    """``$ASTRAFLOW_HOME`` if set, else ``~/.cache/astraflow/kafka``."""
    env = os.environ.get("ASTRAFLOW_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "astraflow" / "kafka"


@dataclass(frozen=True)
class BrokerStatus:
    """What ``LocalKafkaBroker.status`` found."""

    running: bool
    pid: int | None
    bootstrap: str
    home: Path


class LocalKafkaBroker:
    """One KRaft node (broker and controller) listening on 127.0.0.1.

    ``port`` and ``controller_port`` default to those of the previous start in this home, else
    9092 and a free port. Topics are never auto-created: producing to a missing topic fails. As a
    node of a cluster it is given its ``node_id``, the cluster's ``cluster_id``, the controller
    ``voters`` (node id → controller port) and how many ``replicas`` topics get.
    """

    def __init__(
        self,
        home: Path,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        jar_cache: Path | None = None,
        version: str = KAFKA_VERSION,
        heap: str = "512m",
        node_id: int = 1,
        cluster_id: str | None = None,
        voters: dict[int, int] | None = None,
        replicas: int = 1,
        security: SecurityFiles | None = None,
        internal_port: int | None = None,
    ) -> None:
        self.home = Path(home).expanduser().resolve()
        self.version = version
        self.heap = heap
        self.libs_dir = Path(jar_cache or self.home).expanduser().resolve() / f"libs-{version}"
        saved = self._read_meta()
        self.port = port or saved.get("port") or DEFAULT_PORT
        self.controller_port = controller_port or saved.get("controller_port") or free_port(avoid={self.port})
        self._cluster_id: str = cluster_id or saved.get("cluster_id") or new_cluster_id()
        self.node_id = node_id
        self.voters = voters or {node_id: self.controller_port}
        self.replicas = replicas
        if security is not None and saved and not saved.get("secure"):
            raise BrokerError(f"the broker in {self.home} was made without --secure: use --home for a secure one")
        if security is None and saved.get("secure"):
            security = SecurityFiles(self.home / "security")  # a secure home stays secure
        self.security = security
        """The secure profile's files (``secure.py``): SASL_SSL clients, TLS between nodes, ACLs."""
        internal_port = internal_port or saved.get("internal_port")
        self.internal_port = (internal_port or free_port(avoid={self.port, self.controller_port})) if security else None
        self._started = 0.0

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        return f"127.0.0.1:{self.port}"

    def client_config(self, principal: str = "admin") -> dict[str, str]:
        """librdkafka settings a client needs besides the bootstrap: none, or on a secure broker the
        SASL_SSL settings of ``principal``."""
        return self.security.client_config(principal) if self.security else {}

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def _pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def _data_dir(self) -> Path:
        return self.home / "data"

    def fetch(self) -> Path:
        """Copy the broker's jars from Maven Central into ``libs_dir`` unless they are there."""
        return fetch_jars(self.libs_dir, self.version)

    def start(self, timeout: float = 60.0) -> None:
        """Fetch, format (first time only), launch, and return once the broker serves metadata."""
        proc = self.launch()
        if proc is not None:
            self.wait_serving(proc, timeout)

    def launch(self) -> subprocess.Popen | None:
        """Fetch, format (first time only) and launch the JVM without waiting for it to serve;
        ``None`` when this home's broker already runs. (A cluster launches all its nodes first:
        none serves before a majority of controllers is up.)"""
        if self.status().running:
            logger.info("broker in %s already runs at %s", self.home, self.bootstrap)
            return None
        for port in (self.port, self.controller_port, self.internal_port):
            if port is not None and not port_free(port):
                raise BrokerError(f"port {port} on 127.0.0.1 is in use; pick another with --port/--controller-port")
        libs = self.fetch()
        java_bin = host.java()
        self.home.mkdir(parents=True, exist_ok=True)
        props = self._write_config()
        self._format(java_bin, libs, props)
        log4j = self.home / "log4j2.xml"
        log4j.write_bytes(resources.files(__package__).joinpath(_LOG4J).read_bytes())
        cmd = [
            java_bin,
            f"-Xmx{self.heap}",
            "-Xms256m",
            "-XX:+UseG1GC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            "-cp",
            f"{libs}/*",
            "kafka.Kafka",
            str(props),
        ]
        self._started = time.monotonic()
        with self.log_file.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.home,
                start_new_session=True,
            )
        self._pid_file.write_text(str(proc.pid))
        return proc

    def wait_serving(self, proc: subprocess.Popen, timeout: float) -> None:
        """Return once the launched broker serves metadata; stop it and raise ``BrokerError`` if it
        does not within ``timeout``."""
        try:
            self._wait_serving(proc, timeout)
        except BrokerError:
            self.stop(timeout=10.0)
            raise
        logger.info(
            "Kafka %s node %d serves at %s (pid %d) after %.1fs",
            self.version,
            self.node_id,
            self.bootstrap,
            proc.pid,
            time.monotonic() - self._started,
        )

    def status(self) -> BrokerStatus:
        """Whether this home's broker process is alive (its pid file names a live Kafka JVM)."""
        pid = self._read_pid()
        running = pid is not None and is_kafka_process(pid)
        return BrokerStatus(running=running, pid=pid if running else None, bootstrap=self.bootstrap, home=self.home)

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM the broker (a controlled shutdown), SIGKILL after ``timeout``; False if none ran."""
        pid = self._read_pid()
        if pid is None or not is_kafka_process(pid):
            self._pid_file.unlink(missing_ok=True)
            return False
        for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            if wait_exit(pid, wait_s):
                break
            logger.warning("broker pid %d did not exit %.0fs after %s", pid, wait_s, sig.name)
        else:
            raise BrokerError(f"broker pid {pid} survived SIGKILL")
        self._pid_file.unlink(missing_ok=True)
        logger.info("stopped the broker in %s", self.home)
        return True

    def kill(self) -> bool:
        """SIGKILL the broker (a crash: no controlled shutdown) and wait for it to exit; False if none ran."""
        pid = self._read_pid()
        if pid is None or not is_kafka_process(pid):
            return False
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not wait_exit(pid, 10.0):
            raise BrokerError(f"broker pid {pid} survived SIGKILL")
        self._pid_file.unlink(missing_ok=True)
        logger.info("killed the broker in %s", self.home)
        return True

    def __enter__(self) -> "LocalKafkaBroker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_meta(self) -> dict:
        path = self.home / "broker.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _read_pid(self) -> int | None:
        try:
            return int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _write_config(self) -> Path:
        """Write ``broker.json`` and ``server.properties`` for the current ports."""
        meta = {"cluster_id": self._cluster_id, "port": self.port, "controller_port": self.controller_port}
        if self.security is not None:
            meta.update({"secure": True, "internal_port": self.internal_port})
        (self.home / "broker.json").write_text(json.dumps(meta, indent=2) + "\n")
        address = NodeAddress(self.port, self.controller_port, self.internal_port)
        voters = {n: f"127.0.0.1:{port}" for n, port in self.voters.items()}
        settings = node_settings(self.node_id, voters, address, self._data_dir, self.replicas, self.security)
        props = self.home / "server.properties"
        props.write_text(properties_text(settings))
        return props

    def _format(self, java: str, libs: Path, props: Path) -> None:
        """Format the KRaft storage once; a formatted data dir keeps its topics across restarts."""
        if (self._data_dir / "meta.properties").exists():
            return
        cmd = [
            java,
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            f"{libs}/*",
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self._cluster_id,
            "-c",
            str(props),
            *(self.security.scram_arguments() if self.security else []),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise BrokerError(f"formatting {self._data_dir} failed:\n{tail(result.stdout + result.stderr)}")

    def _wait_serving(self, proc: subprocess.Popen, timeout: float) -> None:
        """Wait until the port accepts connections and the broker answers a metadata request."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(f"the broker exited during start-up (status {proc.returncode}); {self._log_tail()}")
            if admin is None and not listening(self.port):
                time.sleep(0.2)
                continue
            admin = admin or AdminClient(
                {"bootstrap.servers": self.bootstrap, "reconnect.backoff.max.ms": 500, **self.client_config()}
            )
            try:
                if admin.list_topics(timeout=max(0.5, min(5.0, deadline - time.monotonic()))).brokers:
                    return
            except KafkaException:
                time.sleep(0.2)
        raise BrokerError(f"the broker did not serve within {timeout:.0f}s; {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return f"{self.log_file} ends with:\n{tail(self.log_file.read_text(errors='replace'))}"
        except FileNotFoundError:
            return f"{self.log_file} is missing"
