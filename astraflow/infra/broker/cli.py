"""``astraflow broker start | status | stop``: the local Kafka broker, one node or (``--nodes 3``) a
cluster of three, the durable profile.

Imported by ``astraflow.cli`` at start-up, so this module imports only typer; the broker
module (and with it confluent-kafka) loads inside each command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from astraflow.infra.broker.cluster import LocalKafkaCluster
    from astraflow.infra.broker.local import LocalKafkaBroker

broker_app = typer.Typer(
    no_args_is_help=True, help="Run a local Apache Kafka broker (KRaft) from the Maven Central jars."
)

HomeOpt = Annotated[
    Optional[Path],
    typer.Option("--home", help="Broker home: data, logs, pid (default $ASTRAFLOW_HOME or ~/.cache/astraflow/kafka)."),
]
PortOpt = Annotated[Optional[int], typer.Option("--port", help="Client port (default: the last one used, else 9092).")]
JarsOpt = Annotated[
    Optional[Path],
    typer.Option("--jars", help="Folder that caches the jars (default: the default home, shared by every --home)."),
]

_NOT_RUNNING = 3
"""Exit code of ``status`` when no broker runs, as for LSB init scripts."""


def _broker(
    home: Optional[Path],
    port: Optional[int] = None,
    controller_port: Optional[int] = None,
    jars: Optional[Path] = None,
    secure: bool = False,
) -> "LocalKafkaBroker":
    from astraflow.infra.broker.local import LocalKafkaBroker, default_home
    from astraflow.infra.broker.secure import SecurityFiles

    home = (home or default_home()).expanduser().resolve()
    security = SecurityFiles(home / "security").make() if secure else None
    return LocalKafkaBroker(home, port, controller_port, jar_cache=jars or default_home(), security=security)


def _cluster(
    home: Optional[Path],
    nodes: Optional[int] = None,
    port: Optional[int] = None,
    jars: Optional[Path] = None,
    secure: bool = False,
) -> "LocalKafkaCluster | None":
    """The cluster of ``home``: one to start (``nodes`` given), or one started there before; else ``None``."""
    from astraflow.infra.broker.cluster import LocalKafkaCluster, is_cluster_home
    from astraflow.infra.broker.local import default_home

    home = home or default_home()
    if nodes is None and not is_cluster_home(home):
        return None
    return LocalKafkaCluster(home, nodes, port, jar_cache=jars or default_home(), secure=secure)


@broker_app.command()
def start(
    home: HomeOpt = None,
    port: PortOpt = None,
    controller_port: Annotated[Optional[int], typer.Option("--controller-port", help="KRaft controller port.")] = None,
    jars: JarsOpt = None,
    nodes: Annotated[
        Optional[int],
        typer.Option(
            "--nodes",
            min=2,
            help=(
                "Run a cluster of this many nodes on ports PORT.. instead of one (3: every partition on three"
                " nodes, two in sync before a write is acknowledged; one node is not durable)."
            ),
        ),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds to wait until it serves.")] = 60.0,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help=(
                "SASL_SSL (SCRAM-SHA-512 over TLS, a local CA made in HOME/security) with ACLs: a principal per"
                " component role, least privilege (`astraflow broker grant` gives a run's); needs a fresh --home."
            ),
        ),
    ] = False,
) -> None:
    """Fetch the jars (first time), format the storage (first time), start the broker detached."""
    from rich.console import Console

    from astraflow.core.errors import BrokerError

    console = Console()
    try:
        cluster = _cluster(home, nodes, port, jars, secure)
        broker = cluster or _broker(home, port, controller_port, jars, secure)
        with console.status(f"starting Kafka {broker.version} in {broker.home} ..."):
            broker.start(timeout=timeout)
    except BrokerError as exc:
        console.print(f"[red]broker failed:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from exc
    if cluster is not None:
        pids = ", ".join(f"node {n} pid {pid}" for n, pid in cluster.status().pids.items())
        console.print(f"running: bootstrap {cluster.bootstrap} ({pids}, home {cluster.home})", highlight=False)
    else:
        console.print(
            f"running: bootstrap {broker.bootstrap} (pid {broker.status().pid}, home {broker.home})", highlight=False
        )
    if broker.security is not None:
        files = broker.security
        console.print(
            f"secure: SASL_SSL, SCRAM-SHA-512; CA {files.ca}; one password file per principal in {files.directory}"
            " (admin, feeder, producer, stream, trainer, evaluator, analysis); a run's config names its principal in"
            " log.security",
            highlight=False,
        )


@broker_app.command()
def status(home: HomeOpt = None) -> None:
    """Print whether the broker of this home runs; exit code 3 when it does not."""
    cluster = _cluster(home)
    if cluster is not None:
        state = cluster.status()
        nodes = ", ".join(f"node {n} {'pid ' + str(pid) if pid else 'stopped'}" for n, pid in state.pids.items())
        typer.echo(f"{state.running} of {len(state.pids)} nodes running: bootstrap {state.bootstrap} ({nodes})")
        if not state.running:
            raise typer.Exit(_NOT_RUNNING)
        return
    single = _broker(home).status()
    if single.running:
        typer.echo(f"running: bootstrap {single.bootstrap} (pid {single.pid}, home {single.home})")
        return
    typer.echo(f"stopped (home {single.home})")
    raise typer.Exit(_NOT_RUNNING)


@broker_app.command()
def stop(
    home: HomeOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds before SIGKILL.")] = 30.0,
) -> None:
    """Stop the broker (every node of a cluster) with a controlled shutdown (SIGTERM), SIGKILL after the timeout."""
    broker = _cluster(home) or _broker(home)
    typer.echo("stopped" if broker.stop(timeout=timeout) else f"not running (home {broker.home})")


@broker_app.command()
def grant(
    config: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Run config (YAML).")],
    home: HomeOpt = None,
    bootstrap: Annotated[
        Optional[str],
        typer.Option(
            "--bootstrap",
            help=(
                "Grant on this cluster instead of the broker of a local home (the compose stack's), logging in as"
                " admin with --security or else the config's log.security."
            ),
        ),
    ] = None,
    security: Annotated[
        Optional[Path],
        typer.Option(
            "--security",
            exists=True,
            dir_okay=False,
            help="With --bootstrap: a YAML file holding the cluster's log.security (a run config, or the section).",
        ),
    ] = None,
) -> None:
    """On a secure cluster, as its admin: create the run's topics, write the schemas and grant each
    component role its ACLs on them (least privilege; see astraflow/infra/broker/acls.py). The cluster is the
    secure broker of a local home, or with --bootstrap any secure cluster."""
    from astraflow.config import load_config
    from astraflow.core.errors import BrokerError
    from astraflow.infra.broker.acls import grant_run
    from astraflow.log import open_log
    from astraflow.runtime.schema_store import LogSchemaStore
    from astraflow.runtime.topics import RunTopics

    run = load_config(config)
    if bootstrap is not None:
        if home is not None:
            raise BrokerError("--home and --bootstrap: give one, the local broker or another cluster")
        target, admin = bootstrap, _admin_of(run.log.security, security)
    else:
        if security is not None:
            raise BrokerError("--security goes with --bootstrap: a local home's broker has its own credentials")
        broker = _cluster(home) or _broker(home)
        if broker.security is None:
            raise BrokerError(f"the broker in {broker.home} is not secure: ACLs need `astraflow broker start --secure`")
        target, admin = broker.bootstrap, broker.client_config("admin")
    topics = RunTopics(run.run, run.workflow, run.policy_names())
    with open_log("kafka", bootstrap=target, client_config=admin) as log:
        topics.ensure(log, run.log.partitions, run.weights.chunk_bytes)
        LogSchemaStore(log).close()
    count = grant_run({"bootstrap.servers": target, **admin}, topics)
    typer.echo(f"run {run.run!r}: topics made, schemas written, {count} ACLs granted on {target}")


def _admin_of(configured, security_file: Optional[Path]) -> dict[str, str]:
    """The admin's client settings under ``security_file``'s log.security, else the run config's
    (``configured``): with ``role_credentials`` the admin's own, else the one user it names."""
    from astraflow.config.log import load_security
    from astraflow.core.errors import BrokerError

    security = load_security(security_file) if security_file is not None else configured
    if not security.sasl:
        raise BrokerError(
            f"--bootstrap: log.security has protocol {security.protocol}; ACLs need SASL principals"
            " (give --security with a SASL_SSL section, e.g. the compose stack's log-security.yaml)"
        )
    return security.client_config()


@broker_app.command("secure-config")
def secure_config(
    out: Annotated[Path, typer.Option("--out", help="Directory to write into (the compose stack's security volume).")],
    hosts: Annotated[
        str, typer.Option("--hosts", help="The nodes' hostnames, comma-separated: node 1, 2, ... (kafka,kafka-2,...).")
    ],
    external: Annotated[
        Optional[str],
        typer.Option(
            "--external",
            help=(
                "Per host, in order, the host:port clients outside the container network reach it at (a port"
                " published on the host): each node then has a second SASL_SSL listener on --external-port."
            ),
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="Client port (SASL_SSL) inside the network.")] = 9092,
    internal_port: Annotated[
        int, typer.Option("--internal-port", help="Replication port (mutual TLS between the nodes).")
    ] = 9091,
    controller_port: Annotated[
        int, typer.Option("--controller-port", help="KRaft controller port (mutual TLS).")
    ] = 9093,
    external_port: Annotated[
        int, typer.Option("--external-port", help="Container port of the --external listener.")
    ] = 9094,
    bind: Annotated[str, typer.Option("--bind", help="Interface every listener binds.")] = "0.0.0.0",
    data_dir: Annotated[str, typer.Option("--data-dir", help="The nodes' log.dirs.")] = "/var/lib/kafka/data",
    owner: Annotated[
        Optional[str],
        typer.Option("--owner", help="UID:GID to hand every file to: the user the Kafka image runs as (1000:1000)."),
    ] = None,
) -> None:
    """Write the secure nodes' configuration for containers: CA, node certificate, passwords, each node's
    server.properties (the settings of `broker start --secure`), and what the nodes' format step, their
    healthcheck and the AstraFlow services read (docker-compose.secure.yml runs it)."""
    from astraflow.infra.broker.container import ContainerNodes, parse_owner, write_secure_config

    nodes = ContainerNodes(
        hosts=tuple(_names(hosts)),
        port=port,
        internal_port=internal_port,
        controller_port=controller_port,
        external=tuple(_names(external or "")),
        external_port=external_port,
        bind=bind,
        data_dir=data_dir,
    )
    files = write_secure_config(out, nodes, parse_owner(owner) if owner else None)
    typer.echo(
        f"secure configuration for {', '.join(nodes.hosts)} in {files.directory}: CA, node certificate for"
        f" {', '.join(files.hosts)}, a password per principal, {len(nodes.hosts)} server.properties"
    )


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
