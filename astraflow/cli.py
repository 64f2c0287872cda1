"""The ``astraflow`` command line: one subcommand per component and tool.

Each command imports its implementation inside the function body, so ``astraflow --help`` and the
log/schema layers stay fast to import (no torch, transformers or faust at start-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from astraflow.infra.cli import broker_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="AstraFlow: RL for agentic LLMs on a durable Avro log.")
app.add_typer(broker_app, name="broker")

ConfigArg = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Run config (YAML).")]
RunDirOpt = Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory (default runs/<run name>).")]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", help="Log backend: embedded or kafka (overrides log.backend).")]
BootstrapOpt = Annotated[Optional[str], typer.Option("--bootstrap", help="Kafka bootstrap servers (overrides log.bootstrap).")]


def _component(name: str, config: Path, run_dir: Optional[Path], backend: Optional[str], bootstrap: Optional[str]):
    from astraflow.infra.process import default_run_dir, resolve_config

    cfg = resolve_config(config, backend, bootstrap)
    return cfg, run_dir or default_run_dir(cfg)


@app.command()
def warmup(config: ConfigArg, run_dir: RunDirOpt = None) -> None:
    """Build the tiny model, supervise it to the warm-up accuracy, and cache that base checkpoint."""
    from astraflow.consumers.base_checkpoint import ensure_base_checkpoint
    from astraflow.infra.process import setup_logging

    cfg, directory = _component("warmup", config, run_dir, None, None)
    setup_logging("warmup", directory)
    typer.echo(ensure_base_checkpoint(cfg, directory))


@app.command()
def feed(config: ConfigArg, run_dir: RunDirOpt = None, backend: BackendOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Task feeder: dataset → tasks topic, within the staleness budget."""
    from astraflow.infra.process import run_component
    from astraflow.producers.feeder import TaskFeeder
    from astraflow.tasks.datasets import load_task_split

    cfg, directory = _component("feed", config, run_dir, backend, bootstrap)
    rows = load_task_split(cfg.task, directory, "train")
    run_component("feed", cfg, directory, lambda ctx, stop: TaskFeeder(ctx, rows, cfg.task.seed).run(stop))


@app.command()
def rollout(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    region: Annotated[str, typer.Option(help="Region label recorded on every trajectory.")] = "local",
) -> None:
    """Rollout producer: tasks → trajectories, refreshing weights from the weights topic."""
    from astraflow.infra.process import run_component
    from astraflow.producers.rollout import RolloutProducer

    cfg, directory = _component("rollout", config, run_dir, backend, bootstrap)
    run_component("rollout", cfg, directory, lambda ctx, stop: RolloutProducer(ctx, region=region).run(stop))


@app.command()
def stream(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    runtime: Annotated[str, typer.Option(help="Stream runtime: native (any log).")] = "native",
) -> None:
    """Stream processor: trajectories → filters and advantages → train samples."""
    from astraflow.errors import ConfigError
    from astraflow.infra.process import run_component
    from astraflow.streams.native import NativeStreamProcessor

    if runtime != "native":
        raise ConfigError(f"--runtime: {runtime!r} is not available; use 'native'")
    cfg, directory = _component("stream", config, run_dir, backend, bootstrap)
    run_component("stream", cfg, directory, lambda ctx, stop: NativeStreamProcessor(ctx, cfg.policy).run(stop))


@app.command()
def train(config: ConfigArg, run_dir: RunDirOpt = None, backend: BackendOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Trainer: train samples → optimizer steps → weight versions; checkpoints and resumes."""
    from astraflow.consumers.trainer import Trainer
    from astraflow.infra.process import run_component

    cfg, directory = _component("train", config, run_dir, backend, bootstrap)
    run_component("train", cfg, directory, lambda ctx, stop: Trainer(ctx, cfg.policy).run(stop))


@app.command()
def evaluate(config: ConfigArg, run_dir: RunDirOpt = None, backend: BackendOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Evaluator: held-out greedy exact match of each new weight version → metrics topic."""
    from astraflow.consumers.evaluator import Evaluator
    from astraflow.infra.process import run_component

    cfg, directory = _component("evaluate", config, run_dir, backend, bootstrap)
    run_component("evaluate", cfg, directory, lambda ctx, stop: Evaluator(ctx, cfg.policy).run(stop))


@app.command()
def run(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    max_minutes: Annotated[Optional[float], typer.Option(help="Wall-clock budget after warm-up (overrides stop.max_minutes).")] = None,
    dashboard: Annotated[bool, typer.Option(help="Show the live dashboard.")] = True,
) -> None:
    """Run every component of CONFIG as its own process on one machine, then write the report."""
    from astraflow.infra.launcher import launch
    from astraflow.infra.process import default_run_dir, resolve_config

    overrides = {"stop.max_minutes": max_minutes} if max_minutes else None
    cfg = resolve_config(config, backend, bootstrap, overrides)
    directory = run_dir or default_run_dir(cfg)
    summary = launch(cfg, directory, dashboard=dashboard)
    typer.echo(f"run directory: {directory}")
    typer.echo(f"held-out accuracy {summary['base_accuracy']:.3f} -> {summary['final_accuracy']:.3f} in {summary['versions']} versions, {summary['wall_seconds']:.0f} s")


@app.command()
def tail(
    topic: Annotated[str, typer.Argument(help="Topic to read, e.g. main.trajectories.main")],
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory of an embedded log.")] = None,
    bootstrap: BootstrapOpt = None,
    group: Annotated[Optional[str], typer.Option(help="Consumer group (default: none, nothing committed).")] = None,
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record instead of the end.")] = False,
    limit: Annotated[Optional[int], typer.Option(help="Stop after this many records.")] = None,
    idle_timeout: Annotated[Optional[float], typer.Option(help="Stop after this many seconds without a record.")] = None,
) -> None:
    """Print the records of any topic as JSON lines (Avro decoded)."""
    from astraflow.consumers.tail import tail_topic
    from astraflow.errors import ConfigError
    from astraflow.log import open_log

    if (run_dir is None) == (bootstrap is None):
        raise ConfigError("tail: give exactly one of --run-dir (embedded log) or --bootstrap (Kafka)")
    log = open_log("kafka", bootstrap=bootstrap) if bootstrap else open_log("embedded", path=run_dir / "log.sqlite")
    with log:
        for line in tail_topic(log, topic, group=group, from_beginning=from_beginning, limit=limit, idle_timeout=idle_timeout):
            typer.echo(line)


def main() -> None:
    """Console entry point: AstraFlow errors print one clear line and exit 2, not a traceback."""
    from astraflow.errors import AstraFlowError

    try:
        app()
    except AstraFlowError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc


if __name__ == "__main__":
    main()
