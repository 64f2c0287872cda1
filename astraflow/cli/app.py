"""The ``astraflow`` typer app and the argument types its commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from astraflow.infra.broker.cli import broker_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="AstraFlow: RL for agentic LLMs on a durable Avro log."
)
app.add_typer(broker_app, name="broker")

ConfigArg = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Run config (YAML).")]
RunDirOpt = Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory (default runs/<run name>).")]
BackendOpt = Annotated[
    Optional[str], typer.Option("--backend", help="Log backend: embedded or kafka (overrides log.backend).")
]
BootstrapOpt = Annotated[
    Optional[str], typer.Option("--bootstrap", help="Kafka bootstrap servers (overrides log.bootstrap).")
]
SecurityOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--security",
        exists=True,
        dir_okay=False,
        help=(
            "With --bootstrap: a YAML file holding the cluster's log.security (a run config, or the section "
            "alone); with role_credentials the command logs in as `analysis` (runs rm: `admin`)."
        ),
    ),
]
LogSecurityOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--security",
        exists=True,
        dir_okay=False,
        help=(
            "A YAML file holding the cluster's log.security (a run config, or the section alone), used instead of "
            "CONFIG's: a deployment's credentials over an example config (the secure compose stack's); with "
            "role_credentials the component logs in as its role."
        ),
    ),
]
PolicyOpt = Annotated[
    Optional[str], typer.Option("--policy", help="Which of the config's policies (required when it declares several).")
]
