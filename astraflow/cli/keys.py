"""``astraflow keys``: the key pair that signs weight versions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.app import app

keys_app = typer.Typer(no_args_is_help=True, help="Keys for signed weight versions (weights.signing_key/verify_key).")
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(
    directory: Annotated[Path, typer.Argument(file_okay=False, help="Folder for the two key files.")],
    name: Annotated[str, typer.Option("--name", help="File name stem of the key pair.")] = "weights-signing",
) -> None:
    """Make an Ed25519 key pair: NAME.pem (private, mode 0600, for the trainer) and NAME.pub.pem (for
    every reader of the weights); prints the config lines that use them. Never overwrites a key."""
    from astraflow.weights.signing import generate_key_pair

    private, public, fingerprint = generate_key_pair(directory, name)
    typer.echo(f"key {fingerprint}: private {private} (only the trainer needs it), public {public}")
    typer.echo("weights:")
    typer.echo(f"  signing_key: {private.resolve()}")
    typer.echo(f"  verify_key: {public.resolve()}")
