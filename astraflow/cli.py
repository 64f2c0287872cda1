"""The ``astraflow`` command line: one subcommand per component and tool.

Each command imports its implementation inside the function body, so ``astraflow --help`` and the
log/schema layers stay fast to import (no torch, transformers or faust at start-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from astraflow.broker.cli import broker_app
from astraflow.rundir import RunDir

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
PolicyOpt = Annotated[
    Optional[str], typer.Option("--policy", help="Which of the config's policies (required when it declares several).")
]


def _component(name: str, config: Path, run_dir: Optional[Path], backend: Optional[str], bootstrap: Optional[str]):
    from astraflow.launch.process import resolve_config

    cfg = resolve_config(config, backend, bootstrap)
    return cfg, run_dir or RunDir.default(cfg.run).root


def _one_policy(cfg, policy: Optional[str]):
    """The config narrowed to one policy (``RunConfig.for_policy``): ``--policy``, or the only one."""
    from astraflow.errors import ConfigError

    if policy is None and len(cfg.policy_names()) > 1:
        raise ConfigError(f"--policy: required, the config declares the policies {list(cfg.policy_names())}")
    return cfg.for_policy(policy or cfg.policy_names()[0])


@app.command(
    help=(
        "Build the tiny model, supervise it to the warm-up accuracy, and cache that base checkpoint "
        "(of every policy, or ``--policy``)."
    )
)
def warmup(config: ConfigArg, run_dir: RunDirOpt = None, policy: PolicyOpt = None) -> None:
    from astraflow.basemodel.cache import ensure_base_checkpoint
    from astraflow.launch.process import setup_logging

    cfg, directory = _component("warmup", config, run_dir, None, None)
    setup_logging("warmup", directory)
    for name in (policy,) if policy else cfg.policy_names():
        typer.echo(ensure_base_checkpoint(cfg.for_policy(name), directory))


@app.command()
def feed(
    config: ConfigArg, run_dir: RunDirOpt = None, backend: BackendOpt = None, bootstrap: BootstrapOpt = None
) -> None:
    """Task feeder: dataset → tasks topic, within the staleness budget."""
    from astraflow.launch.process import run_component
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
    hardware: Annotated[
        Optional[str], typer.Option(help="Hardware label recorded on every trajectory (default cpu:<arch>x<threads>).")
    ] = None,
    batch: Annotated[
        Optional[int], typer.Option(min=1, help="Tasks per generation (overrides rollout.prompts_per_generation).")
    ] = None,
    threads: Annotated[
        Optional[int], typer.Option(min=1, help="torch threads of this producer (overrides rollout.threads).")
    ] = None,
) -> None:
    """Rollout producer: joins the pool at any time (after catching up on weights), leaves cleanly on SIGTERM."""
    from astraflow.launch.process import resolve_config, run_component
    from astraflow.producers.rollout import RolloutProducer

    overrides = {
        key: value for key, value in (("rollout.prompts_per_generation", batch), ("rollout.threads", threads)) if value
    }
    cfg = resolve_config(config, backend, bootstrap, overrides)
    directory = run_dir or RunDir.default(cfg.run).root
    run_component(
        "rollout", cfg, directory, lambda ctx, stop: RolloutProducer(ctx, region=region, hardware=hardware).run(stop)
    )


@app.command()
def scale(
    config: ConfigArg, run_dir: RunDirOpt = None, backend: BackendOpt = None, bootstrap: BootstrapOpt = None
) -> None:
    """Scaler: trainer wait fraction → desired rollout producers, written to the metrics topic."""
    from astraflow.launch.process import run_component
    from astraflow.scaler.component import ScalerComponent

    cfg, directory = _component("scale", config, run_dir, backend, bootstrap)
    run_component("scale", cfg, directory, lambda ctx, stop: ScalerComponent(ctx, cfg.policy).run(stop))


@app.command()
def stream(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    runtime: Annotated[
        Optional[str],
        typer.Option(
            help=(
                "Stream runtime: native (any log) or faust (Kafka only); overrides stream.runtime "
                "(default: faust on Kafka, native on the embedded log)."
            )
        ),
    ] = None,
    policy: PolicyOpt = None,
) -> None:
    """Stream processor: trajectories → filters and advantages → train samples."""
    from astraflow.launch.process import resolve_config, run_component

    cfg = resolve_config(config, backend, bootstrap, {"stream.runtime": runtime} if runtime else None)
    directory = run_dir or RunDir.default(cfg.run).root
    cfg = _one_policy(cfg, policy)
    if cfg.stream_runtime() == "faust":
        from astraflow.streams.faust_runtime import FaustStreamProcessor as Processor
    else:
        from astraflow.streams.native import NativeStreamProcessor as Processor
    run_component("stream", cfg, directory, lambda ctx, stop: Processor(ctx, cfg.policy).run(stop))


@app.command()
def train(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    policy: PolicyOpt = None,
) -> None:
    """Trainer: train samples → optimizer steps → weight versions; checkpoints and resumes."""
    from astraflow.consumers.trainer import Trainer
    from astraflow.launch.process import run_component

    cfg, directory = _component("train", config, run_dir, backend, bootstrap)
    cfg = _one_policy(cfg, policy)
    run_component("train", cfg, directory, lambda ctx, stop: Trainer(ctx, cfg.policy).run(stop))


@app.command()
def evaluate(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    policy: PolicyOpt = None,
    system: Annotated[
        bool,
        typer.Option(
            "--system", help="Evaluate the policies together (the workflow's system accuracy) instead of one policy."
        ),
    ] = False,
) -> None:
    """Evaluator: held-out greedy exact match of each new weight version → metrics topic."""
    from astraflow.launch.process import run_component

    cfg, directory = _component("evaluate", config, run_dir, backend, bootstrap)
    if system:
        from astraflow.consumers.system_evaluator import SystemEvaluator

        run_component("evaluate", cfg, directory, lambda ctx, stop: SystemEvaluator(ctx).run(stop))
        return
    from astraflow.consumers.evaluator import Evaluator

    cfg = _one_policy(cfg, policy)
    run_component("evaluate", cfg, directory, lambda ctx, stop: Evaluator(ctx, cfg.policy).run(stop))


@app.command()
def run(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    max_minutes: Annotated[
        Optional[float], typer.Option(help="Wall-clock budget after warm-up (overrides stop.max_minutes).")
    ] = None,
    dashboard: Annotated[bool, typer.Option(help="Show the live dashboard.")] = True,
) -> None:
    """Run every component of CONFIG as its own process on one machine, then write the report."""
    from astraflow.launch.launcher import launch
    from astraflow.launch.process import resolve_config

    overrides = {"stop.max_minutes": max_minutes} if max_minutes else None
    cfg = resolve_config(config, backend, bootstrap, overrides)
    directory = run_dir or RunDir.default(cfg.run).root
    summary = launch(cfg, directory, dashboard=dashboard)
    typer.echo(f"run directory: {directory}")
    typer.echo(
        f"held-out accuracy {summary['base_accuracy']:.3f} -> {summary['final_accuracy']:.3f} "
        f"in {summary['versions']} versions, {summary['wall_seconds']:.0f} s"
    )


@app.command(
    help=(
        "Train a fresh base model of CONFIG from the trajectories a SOURCE run logged "
        "(finished or live; the source is only read)."
    )
)
def replay(
    config: ConfigArg,
    source: Annotated[
        Path,
        typer.Option("--source", exists=True, help="The source run: its directory (with config.yaml), or its config."),
    ],
    source_backend: Annotated[
        Optional[str],
        typer.Option("--source-backend", help="The source run's log backend (overrides its log.backend)."),
    ] = None,
    source_bootstrap: Annotated[
        Optional[str], typer.Option("--source-bootstrap", help="The source run's Kafka bootstrap servers.")
    ] = None,
    from_offset: Annotated[
        Optional[int], typer.Option("--from-offset", min=0, help="Copy from this offset of every partition.")
    ] = None,
    since: Annotated[
        Optional[str], typer.Option(help="Copy the records appended at or after this ISO 8601 time.")
    ] = None,
    until: Annotated[Optional[str], typer.Option(help="Copy the records appended before this ISO 8601 time.")] = None,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    max_minutes: Annotated[
        Optional[float], typer.Option(help="Wall-clock budget after warm-up (overrides stop.max_minutes).")
    ] = None,
    dashboard: Annotated[bool, typer.Option(help="Show the live dashboard.")] = True,
) -> None:
    from astraflow.attach import open_run
    from astraflow.launch.process import resolve_config
    from astraflow.launch.replay import parse_time_ms
    from astraflow.launch.replay import replay as replay_run

    cfg = resolve_config(config, backend, bootstrap, {"stop.max_minutes": max_minutes} if max_minutes else None)
    span = {
        "from_offset": from_offset,
        "since_ms": parse_time_ms(since, "--since") if since else None,
        "until_ms": parse_time_ms(until, "--until") if until else None,
    }
    directory = run_dir or RunDir.default(cfg.run).root
    with open_run(source, backend=source_backend, bootstrap=source_bootstrap) as attached:
        summary = replay_run(cfg, attached, directory, span, dashboard=dashboard)
    section = summary["replay"]
    typer.echo(f"run directory: {directory}")
    typer.echo(
        f"replayed {section['copied']} trajectories of {section['source_topic']} "
        f"({section['stop_reason'] or 'stopped'})"
    )
    typer.echo(
        f"held-out accuracy {summary['base_accuracy']:.3f} -> {summary['final_accuracy']:.3f} "
        f"(best {summary['best_accuracy']:.3f}) "
        f"in {summary['versions']} versions, {summary['wall_seconds']:.0f} s"
    )


@app.command()
def tail(
    topic: Annotated[str, typer.Argument(help="Topic to read, e.g. main.trajectories.main")],
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory of an embedded log.")] = None,
    bootstrap: BootstrapOpt = None,
    group: Annotated[Optional[str], typer.Option(help="Consumer group (default: none, nothing committed).")] = None,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest record instead of the end.")
    ] = False,
    limit: Annotated[Optional[int], typer.Option(help="Stop after this many records.")] = None,
    idle_timeout: Annotated[
        Optional[float], typer.Option(help="Stop after this many seconds without a record.")
    ] = None,
    policy: Annotated[Optional[str], typer.Option(help="Only records of this policy.")] = None,
    min_version: Annotated[Optional[int], typer.Option(help="Only records of this weight version or newer.")] = None,
    where: Annotated[
        Optional[list[str]], typer.Option(help="FIELD OP NUMBER, e.g. 'reward>0' (repeatable: all must hold).")
    ] = None,
) -> None:
    """Print the records of any topic as JSON lines (Avro decoded), optionally filtered."""
    from astraflow.analysis.record_filter import RecordFilter
    from astraflow.analysis.tail import tail_topic
    from astraflow.errors import ConfigError
    from astraflow.log import open_log

    if (run_dir is None) == (bootstrap is None):
        raise ConfigError("tail: give exactly one of --run-dir (embedded log) or --bootstrap (Kafka)")
    select = RecordFilter.parse(policy, min_version, where or [])
    log = open_log("kafka", bootstrap=bootstrap) if bootstrap else open_log("embedded", path=RunDir(run_dir).log)
    with log:
        for line in tail_topic(
            log,
            topic,
            group=group,
            from_beginning=from_beginning,
            limit=limit,
            idle_timeout=idle_timeout,
            select=select if select.active else None,
        ):
            typer.echo(line)


@app.command(
    help=(
        "Account for every trajectory: trained (version), filtered, dead-lettered or pending; "
        "exit 1 if any is lost or trained twice."
    )
)
def audit(
    target: Annotated[
        Path, typer.Argument(help="Run directory (with the config.yaml that `astraflow run` saved) or run config.")
    ],
    run_dir: RunDirOpt = None,
    bootstrap: BootstrapOpt = None,
    versions: Annotated[
        bool, typer.Option("--versions", help="Also list how many trajectories each version trained.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    import json

    from astraflow.analysis.audit import audit_run, format_report
    from astraflow.attach import open_run

    with open_run(target, run_dir, bootstrap=bootstrap) as run:
        report = audit_run(run)
    typer.echo(json.dumps(report.to_dict()) if as_json else format_report(report, versions))
    if not report.ok:
        raise typer.Exit(1)


RunTargetArg = Annotated[
    Path, typer.Argument(exists=True, help="Run directory (with its config.yaml), or the run's config (YAML).")
]


@app.command()
def stats(
    target: RunTargetArg,
    run_dir: RunDirOpt = None,
    bootstrap: BootstrapOpt = None,
    window: Annotated[float, typer.Option(min=1, help="Seconds of the recent-throughput window.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as one JSON object.")] = False,
) -> None:
    """Throughput, group lag, staleness, reward by version and drop reasons of a run (live or finished)."""
    import json

    from astraflow.analysis.stats import collect_stats
    from astraflow.attach import open_run

    with open_run(target, run_dir, bootstrap=bootstrap) as attached:
        snapshot = collect_stats(attached, window_s=window)
    if as_json:
        typer.echo(json.dumps(snapshot.to_dict(), indent=2))
        return
    from rich.console import Console

    from astraflow.analysis.stats_view import render_stats

    Console().print(render_stats(snapshot))


@app.command()
def report(
    target: RunTargetArg,
    run_dir: RunDirOpt = None,
    bootstrap: BootstrapOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default RUN_DIR/report).")] = None,
) -> None:
    """PNG plots and a self-contained report.html of a run (live or finished)."""
    from astraflow.analysis.report_data import gather
    from astraflow.analysis.report_page import write_report_files

    data, directory = gather(target, run_dir, bootstrap)
    for path in write_report_files(data, out or directory / "report"):
        typer.echo(path)


@app.command()
def export(
    topic: Annotated[str, typer.Argument(help="Topic to export, e.g. main.trajectories.main")],
    out: Annotated[Path, typer.Option(help="File to write.")],
    to: Annotated[str, typer.Option(help="Format: jsonl or parquet.")] = "jsonl",
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory of an embedded log.")] = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Write a topic's records (Avro decoded) as jsonl or parquet, for pandas or HF datasets."""
    from astraflow.analysis.export import export_topic
    from astraflow.errors import ConfigError
    from astraflow.log import open_log

    if (run_dir is None) == (bootstrap is None):
        raise ConfigError("export: give exactly one of --run-dir (embedded log) or --bootstrap (Kafka)")
    if run_dir is not None and not RunDir(run_dir).log.exists():
        raise ConfigError(f"--run-dir {run_dir}: no log.sqlite there")
    log = open_log("kafka", bootstrap=bootstrap) if bootstrap else open_log("embedded", path=RunDir(run_dir).log)
    with log:
        result = export_topic(log, topic, to, out)
    skipped = ", ".join(f"{count} {reason}" for reason, count in result.skipped.items())
    typer.echo(f"{out}: {result.rows} records" + (f" (skipped: {skipped})" if skipped else ""))


runs_app = typer.Typer(
    no_args_is_help=True, help="List, describe and delete runs (topics namespaced by run, and run directories)."
)
app.add_typer(runs_app, name="runs")
RunsRootOpt = Annotated[Path, typer.Option("--root", help="Folder holding the run directories.")]


@runs_app.command("ls")
def runs_ls(root: RunsRootOpt = Path("runs"), bootstrap: BootstrapOpt = None) -> None:
    """Every run: directories under --root, and with --bootstrap the run namespaces on that cluster."""
    from rich.console import Console

    from astraflow.analysis.runs import list_runs
    from astraflow.analysis.runs_view import render_runs

    Console().print(render_runs(list_runs(root, bootstrap)))


@runs_app.command("show")
def runs_show(
    run_name: Annotated[
        str, typer.Argument(metavar="RUN", help="Run directory, or run name under --root / on --bootstrap.")
    ],
    root: RunsRootOpt = Path("runs"),
    bootstrap: BootstrapOpt = None,
) -> None:
    """A run's status, topics (partitions, retention, records), consumer-group lag and summary."""
    from rich.console import Console

    from astraflow.analysis.runs import resolve_run, show_run
    from astraflow.analysis.runs_view import render_run

    Console().print(render_run(show_run(resolve_run(run_name, root, bootstrap))))


@runs_app.command("rm")
def runs_rm(
    run_name: Annotated[
        str, typer.Argument(metavar="RUN", help="Run directory, or run name under --root / on --bootstrap.")
    ],
    root: RunsRootOpt = Path("runs"),
    bootstrap: BootstrapOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[bool, typer.Option(help="Delete even a live run.")] = False,
) -> None:
    """Delete a run's topics and its run directory."""
    from astraflow.analysis.runs import remove_run, resolve_run

    ref = resolve_run(run_name, root, bootstrap)
    where = f"directory {ref.run_dir} and " if ref.run_dir else ""
    if not yes:
        typer.confirm(f"delete the {where}topics {ref.name}.* of run {ref.name!r}?", abort=True)
    for removed in remove_run(ref, force=force):
        typer.echo(f"removed {removed}")


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
