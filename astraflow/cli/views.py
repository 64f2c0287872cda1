"""Commands that read a run without taking part in it: tail, audit, stats, report, export, runs,
export-model and metrics serve."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from astraflow.cli.app import BootstrapOpt, RunDirOpt, SecurityOpt, app
from astraflow.core.rundir import RunDir


def _topic_log(command: str, run_dir: Path | None, bootstrap: str | None, security: Path | None):
    """The log ``tail`` and ``export`` read: a run directory's embedded log, or a Kafka cluster
    reached by ``bootstrap`` as the ``analysis`` principal of ``security``."""
    from astraflow.config.log import load_security, security_client_config
    from astraflow.core.errors import ConfigError
    from astraflow.log import open_log

    if (run_dir is None) == (bootstrap is None):
        raise ConfigError(f"{command}: give exactly one of --run-dir (embedded log) or --bootstrap (Kafka)")
    if bootstrap is None:
        if security is not None:
            raise ConfigError(f"{command}: --security is for --bootstrap (an embedded log has no security settings)")
        if not RunDir(run_dir).log.exists():
            raise ConfigError(f"--run-dir {run_dir}: no log.sqlite there")
        return open_log("embedded", path=RunDir(run_dir).log)
    settings = security_client_config(load_security(security) if security else None, "analysis")
    return open_log("kafka", bootstrap=bootstrap, client_config=settings)


@app.command()
def tail(
    topic: Annotated[str, typer.Argument(help="Topic to read, e.g. main.trajectories.main")],
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory of an embedded log.")] = None,
    bootstrap: BootstrapOpt = None,
    security: SecurityOpt = None,
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

    select = RecordFilter.parse(policy, min_version, where or [])
    log = _topic_log("tail", run_dir, bootstrap, security)
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
    from astraflow.runtime.attach import open_run

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
    from astraflow.runtime.attach import open_run

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
    security: SecurityOpt = None,
) -> None:
    """Write a topic's records (Avro decoded) as jsonl or parquet, for pandas or HF datasets."""
    from astraflow.analysis.export import export_topic

    log = _topic_log("export", run_dir, bootstrap, security)
    with log:
        result = export_topic(log, topic, to, out)
    skipped = ", ".join(f"{count} {reason}" for reason, count in result.skipped.items())
    typer.echo(f"{out}: {result.rows} records" + (f" (skipped: {skipped})" if skipped else ""))


runs_app = typer.Typer(
    no_args_is_help=True, help="List, describe and delete runs (topics namespaced by run, and run directories)."
)
app.add_typer(runs_app, name="runs")
RunsRootOpt = Annotated[Path, typer.Option("--root", help="Folder holding the run directories.")]


def _security(path: Path | None):
    from astraflow.config.log import load_security

    return load_security(path) if path is not None else None


@runs_app.command("ls")
def runs_ls(root: RunsRootOpt = Path("runs"), bootstrap: BootstrapOpt = None, security: SecurityOpt = None) -> None:
    """Every run: directories under --root, and with --bootstrap the run namespaces on that cluster."""
    from rich.console import Console

    from astraflow.analysis.runs import list_runs
    from astraflow.analysis.runs_view import render_runs

    Console().print(render_runs(list_runs(root, bootstrap, _security(security))))


@runs_app.command("show")
def runs_show(
    run_name: Annotated[
        str, typer.Argument(metavar="RUN", help="Run directory, or run name under --root / on --bootstrap.")
    ],
    root: RunsRootOpt = Path("runs"),
    bootstrap: BootstrapOpt = None,
    security: SecurityOpt = None,
) -> None:
    """A run's status, topics (partitions, retention, records), consumer-group lag and summary."""
    from rich.console import Console

    from astraflow.analysis.runs import resolve_run, show_run
    from astraflow.analysis.runs_view import render_run

    Console().print(render_run(show_run(resolve_run(run_name, root, bootstrap, _security(security)))))


@runs_app.command("rm")
def runs_rm(
    run_name: Annotated[
        str, typer.Argument(metavar="RUN", help="Run directory, or run name under --root / on --bootstrap.")
    ],
    root: RunsRootOpt = Path("runs"),
    bootstrap: BootstrapOpt = None,
    security: SecurityOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[bool, typer.Option(help="Delete even a live run.")] = False,
) -> None:
    """Delete a run's topics and its run directory."""
    from astraflow.analysis.runs import remove_run, resolve_run

    ref = resolve_run(run_name, root, bootstrap, _security(security))
    where = f"directory {ref.run_dir} and " if ref.run_dir else ""
    if not yes:
        typer.confirm(f"delete the {where}topics {ref.name}.* of run {ref.name!r}?", abort=True)
    for removed in remove_run(ref, force=force):
        typer.echo(f"removed {removed}")


@app.command("export-model")
def export_model(
    target: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Run directory (with its config.yaml).")],
    out: Annotated[Path, typer.Option(help="Directory to write (must not exist).")],
    policy: Annotated[Optional[str], typer.Option(help="Which policy (required when the run has several).")] = None,
    version: Annotated[Optional[int], typer.Option(min=0, help="A checkpointed version (default: the newest).")] = None,
) -> None:
    """Write a checkpointed version of a policy as a Hugging Face save_pretrained directory, with its tokenizer."""
    from astraflow.config import load_config
    from astraflow.core.errors import ConfigError
    from astraflow.training.export import export_version

    if not RunDir(target).config.is_file():
        raise ConfigError(f"{target}: no config.yaml here; give a run directory written by `astraflow run`")
    config = load_config(RunDir(target).config)
    if policy is None and len(config.policy_names()) > 1:
        raise ConfigError(f"--policy: required, the run has the policies {list(config.policy_names())}")
    chosen = export_version(config, target, policy or config.policy_names()[0], out, version)
    typer.echo(f"{out}: version {chosen}")


metrics_app = typer.Typer(no_args_is_help=True, help="A run's metrics for monitoring tools.")
app.add_typer(metrics_app, name="metrics")


@metrics_app.command("serve")
def metrics_serve(
    target: RunTargetArg,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port of the endpoint (0: any free port).")] = 9464,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    run_dir: RunDirOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """A Prometheus endpoint (/metrics) of a run's metrics topic, following the run live until Ctrl-C or SIGTERM."""
    import signal
    import threading

    from astraflow.analysis.prometheus import serve
    from astraflow.runtime.attach import open_run

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    with open_run(target, run_dir, bootstrap=bootstrap) as attached:
        try:
            serve(
                attached,
                port,
                host,
                stop,
                on_ready=lambda url: typer.echo(f"serving {url} for run {attached.name}", nl=True),
            )
        except KeyboardInterrupt:
            pass
