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

QuotaOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--quota",
        metavar="PRINCIPAL:KEY=VALUE,...",
        help=(
            "Set these client quotas of PRINCIPAL (repeatable): producer_byte_rate, consumer_byte_rate (bytes a"
            " second, per broker), request_percentage (of one broker thread's time); KEY= removes one."
            " E.g. producer:producer_byte_rate=16777216."
        ),
    ),
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
    quota: QuotaOpt = None,
) -> None:
    """Fetch the jars (first time), format the storage (first time), start the broker detached; a secure one
    then gets client quotas per role (each role that has none yet: its defaults; --quota: those given)."""
    from rich.console import Console

    from astraflow.core.errors import BrokerError
    from astraflow.infra.broker.acls import parse_quotas

    console = Console()
    try:
        changes = parse_quotas(quota or [])
        cluster = _cluster(home, nodes, port, jars, secure)
        broker = cluster or _broker(home, port, controller_port, jars, secure)
        if changes and broker.security is None:
            raise BrokerError("--quota needs a secure broker (--secure): quotas are per principal")
        with console.status(f"starting Kafka {broker.version} in {broker.home} ..."):
            broker.start(timeout=timeout)
        if broker.security is not None:
            with console.status("setting the client quotas per role ..."):
                _set_quotas(broker, fill=True, replace=changes)
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
            " (admin, feeder, producer, stream, trainer, evaluator, scaler, analysis); a run's config names its"
            " principal in log.security; client quotas per role (`astraflow broker quotas` shows and changes them)",
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


@broker_app.command()
def quotas(
    home: HomeOpt = None,
    quota: QuotaOpt = None,
    defaults: Annotated[
        bool, typer.Option("--defaults", help="Give every role its default quotas again (before any --quota).")
    ] = False,
) -> None:
    """Show, and with --quota or --defaults change, the client quotas per principal of a home's secure broker:
    how fast each may write and read, so that one cannot starve the others (astraflow/infra/broker/acls.py)."""
    from astraflow.core.errors import BrokerError
    from astraflow.infra.broker.acls import DEFAULT_QUOTAS, merged_quotas, parse_quotas

    changes = parse_quotas(quota or [])
    broker = _cluster(home) or _broker(home)
    if not broker.status().running:
        raise BrokerError(f"the broker in {broker.home} is not running: `astraflow broker start --home {broker.home}`")
    described = _set_quotas(broker, fill=False, replace=merged_quotas(DEFAULT_QUOTAS if defaults else {}, changes))
    for principal, values in described.items():
        typer.echo(f"{principal:<10} " + "  ".join(f"{key}={value:.15g}" for key, value in values.items()))


def _set_quotas(broker: "LocalKafkaBroker | LocalKafkaCluster", fill: bool, replace: dict) -> dict:
    """Set (``acls.set_quotas``) on ``broker``: with ``fill`` each role's defaults where it has none, and
    ``replace``; every principal's quotas afterwards."""
    from astraflow.core.errors import BrokerError
    from astraflow.infra.broker.acls import DEFAULT_QUOTAS, set_quotas
    from astraflow.infra.broker.cluster import LocalKafkaCluster

    if broker.security is None:
        raise BrokerError(f"the broker in {broker.home} is not secure (--secure): quotas are per principal")
    libs = broker.nodes[0].libs_dir if isinstance(broker, LocalKafkaCluster) else broker.libs_dir
    return set_quotas(libs, broker.bootstrap, broker.security, DEFAULT_QUOTAS if fill else None, replace)


@broker_app.command()
def credentials(
    principal: Annotated[
        str, typer.Argument(help="Whose: admin, feeder, producer, stream, trainer, evaluator, scaler or analysis.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for this principal alone (made mode 0700).")],
    home: HomeOpt = None,
    mount: Annotated[
        Optional[Path], typer.Option("--mount", help="Where the component sees OUT (a mount point), if elsewhere.")
    ] = None,
) -> None:
    """Copy one principal's password (0600) and the CA certificate out of a secure home, with a log-security.yaml
    that logs in from there: for the OS user or container that runs that role alone (--security
    OUT/log-security.yaml). No other role's password, the admin's or the node key goes with it."""
    from astraflow.core.errors import BrokerError
    from astraflow.infra.broker.local import default_home
    from astraflow.infra.broker.secure import SecurityFiles

    files = SecurityFiles((home or default_home()).expanduser().resolve() / "security")
    if not files.directory.is_dir():
        raise BrokerError(f"no secure broker made {files.directory}: `astraflow broker start --secure --home ...`")
    written = files.export_role(principal, out, mount)
    typer.echo(
        f"{principal}: {principal}.password (0600) and {files.ca.name} in {out} (0700); its components take"
        f" --security {(mount or out.resolve()) / written.name}"
    )


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
        typer.Option("--owner", help="UID:GID to hand OUT's files to: the user the Kafka image runs as (1000:1000)."),
    ] = None,
    roles_out: Annotated[
        Optional[Path],
        typer.Option(
            "--roles-out",
            help="Also a directory ROLES_OUT/PRINCIPAL per --roles, with only its credentials (`broker credentials`).",
        ),
    ] = None,
    roles: Annotated[
        Optional[str],
        typer.Option("--roles", help="With --roles-out: the principals, comma-separated (default: every one)."),
    ] = None,
    role_mount: Annotated[
        Path, typer.Option("--role-mount", help="With --roles-out: where a role's container mounts its directory.")
    ] = Path("/security"),
) -> None:
    """Write the secure nodes' configuration for containers: CA, node certificate, passwords, each node's
    server.properties (the settings of `broker start --secure`), what the nodes' format step, their
    healthcheck and the AstraFlow services read, and client-quotas.txt, each role's default quotas as
    kafka-configs.sh takes them (docker-compose.secure.yml runs it). With --roles-out, a directory per role
    holding only that role's credentials."""
    from astraflow.core.errors import BrokerError
    from astraflow.infra.broker.acls import DEFAULT_QUOTAS, QUOTAS_FILE, quota_lines
    from astraflow.infra.broker.container import ContainerNodes, parse_owner, write_secure_config
    from astraflow.infra.broker.secure import PRINCIPALS

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
    principals = _names(roles) if roles else list(PRINCIPALS)
    unknown = [name for name in principals if name not in PRINCIPALS]
    if unknown or (roles and roles_out is None):
        raise BrokerError(f"--roles {roles}: with --roles-out, and only of the principals {', '.join(PRINCIPALS)}")
    files = write_secure_config(out, nodes, parse_owner(owner) if owner else None)
    (files.directory / QUOTAS_FILE).write_text(quota_lines(DEFAULT_QUOTAS))  # 0644: the Kafka image's user reads it
    for principal in principals if roles_out is not None else []:  # root's: the AstraFlow containers run as root
        files.export_role(principal, roles_out / principal, role_mount)
    typer.echo(
        f"secure configuration for {', '.join(nodes.hosts)} in {files.directory}: CA, node certificate for"
        f" {', '.join(files.hosts)}, a password per principal, {len(nodes.hosts)} server.properties, client quotas"
        + (f"; a directory of its own for {', '.join(principals)} in {roles_out}" if roles_out is not None else "")
    )


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
