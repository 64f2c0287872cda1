"""The ``astraflow`` command line: one subcommand per component and tool.

Each command imports its implementation inside the function body, so ``astraflow --help`` and the
log/schema layers stay fast to import (no torch, transformers or faust at start-up).
"""

from __future__ import annotations

import typer

from astraflow.infra.cli import broker_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="AstraFlow: RL for agentic LLMs on a durable Avro log.")
app.add_typer(broker_app, name="broker")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
