"""The ``astraflow`` command line: one subcommand per component and tool.

Each command imports its implementation inside the function body, so ``astraflow --help`` and the
log/schema layers stay fast to import (no torch, transformers or faust at start-up).
"""

from __future__ import annotations

import typer

from astraflow.cli import components, keys, views
from astraflow.cli.app import app

__all__ = ["app", "components", "keys", "main", "views"]


def main() -> None:
    """Console entry point: AstraFlow errors print one clear line and exit 2, not a traceback."""
    from astraflow.core.errors import AstraFlowError

    try:
        app()
    except AstraFlowError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc
