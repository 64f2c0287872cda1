"""``astraflow broker start | status | stop``: the local single-node Kafka broker.

Imported by ``astraflow.cli`` at start-up, so this module imports only typer; the broker
module (and with it confluent-kafka) loads inside each command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from astraflow.broker.local import LocalKafkaBroker

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
    home: Optional[Path], port: Optional[int] = None, controller_port: Optional[int] = None, jars: Optional[Path] = None
) -> "LocalKafkaBroker":
    from astraflow.broker.local import LocalKafkaBroker, default_home

    return LocalKafkaBroker(home or default_home(), port, controller_port, jar_cache=jars or default_home())


@broker_app.command()
def start(
    home: HomeOpt = None,
    port: PortOpt = None,
    controller_port: Annotated[Optional[int], typer.Option("--controller-port", help="KRaft controller port.")] = None,
    jars: JarsOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds to wait until it serves.")] = 60.0,
) -> None:
    """Fetch the jars (first time), format the storage (first time), start the broker detached."""
    from rich.console import Console

    from astraflow.errors import BrokerError

    broker = _broker(home, port, controller_port, jars)
    console = Console()
    try:
        with console.status(f"starting Kafka {broker.version} in {broker.home} ..."):
            broker.start(timeout=timeout)
    except BrokerError as exc:
        console.print(f"[red]broker failed:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from exc
    console.print(f"running: bootstrap {broker.bootstrap} (pid {broker.status().pid}, home {broker.home})")


@broker_app.command()
def status(home: HomeOpt = None) -> None:
    """Print whether the broker of this home runs; exit code 3 when it does not."""
    state = _broker(home).status()
    if state.running:
        typer.echo(f"running: bootstrap {state.bootstrap} (pid {state.pid}, home {state.home})")
        return
    typer.echo(f"stopped (home {state.home})")
    raise typer.Exit(_NOT_RUNNING)


@broker_app.command()
def stop(
    home: HomeOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds before SIGKILL.")] = 30.0,
) -> None:
    """Stop the broker with a controlled shutdown (SIGTERM), SIGKILL after the timeout."""
    broker = _broker(home)
    typer.echo("stopped" if broker.stop(timeout=timeout) else f"not running (home {broker.home})")
