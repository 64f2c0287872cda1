"""Commands that run one component, or a whole run: warmup, feed, rollout, scale, stream, train,
evaluate, run and replay."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from astraflow.cli.app import BackendOpt, BootstrapOpt, ConfigArg, LogSecurityOpt, PolicyOpt, RunDirOpt, app
from astraflow.core.rundir import RunDir


def _component(
    config: Path,
    run_dir: Optional[Path],
    backend: Optional[str],
    bootstrap: Optional[str],
    overrides: dict[str, object] | None = None,
    security: Optional[Path] = None,
):
    """The resolved config (YAML, ``--backend``/``--bootstrap``, ``--security``, ``overrides``) and the
    run directory (``--run-dir``, else ``runs/<run>``)."""
    from astraflow.infra.launch.process import resolve_config

    overrides = dict(overrides or {})
    if security is not None:
        from astraflow.config.log import load_security

        overrides["log.security"] = load_security(security).model_dump(mode="json", exclude_none=True)
    cfg = resolve_config(config, backend, bootstrap, overrides)
    return cfg, run_dir or RunDir.default(cfg.run).root


def _one_policy(cfg, policy: Optional[str]):
    """The config narrowed to one policy (``RunConfig.for_policy``): ``--policy``, or the only one."""
    from astraflow.core.errors import ConfigError

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
    from astraflow.infra.launch.process import setup_logging

    cfg, directory = _component(config, run_dir, None, None)
    setup_logging("warmup", directory)
    for name in (policy,) if policy else cfg.policy_names():
        typer.echo(ensure_base_checkpoint(cfg.for_policy(name), directory))


@app.command()
def feed(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    security: LogSecurityOpt = None,
) -> None:
    """Task feeder: dataset → tasks topic, within the staleness budget."""
    from astraflow.infra.launch.process import run_component
    from astraflow.producers.feeder.component import TaskFeeder
    from astraflow.tasks.datasets import load_task_split

    cfg, directory = _component(config, run_dir, backend, bootstrap, security=security)
    rows = load_task_split(cfg.task, directory, "train")
    run_component("feed", cfg, directory, lambda ctx, stop: TaskFeeder(ctx, rows, cfg.task.seed).run(stop))


@app.command()
def rollout(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    security: LogSecurityOpt = None,
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
    from astraflow.infra.launch.process import run_component
    from astraflow.producers.rollout.component import RolloutProducer

    overrides = {
        key: value for key, value in (("rollout.prompts_per_generation", batch), ("rollout.threads", threads)) if value
    }
    cfg, directory = _component(config, run_dir, backend, bootstrap, overrides, security)
    run_component(
        "rollout", cfg, directory, lambda ctx, stop: RolloutProducer(ctx, region=region, hardware=hardware).run(stop)
    )


@app.command()
def scale(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    security: LogSecurityOpt = None,
) -> None:
    """Scaler: trainer wait fraction → desired rollout producers, written to the metrics topic."""
    from astraflow.infra.launch.process import run_component
    from astraflow.scaler.component import ScalerComponent

    cfg, directory = _component(config, run_dir, backend, bootstrap, security=security)
    run_component("scale", cfg, directory, lambda ctx, stop: ScalerComponent(ctx, cfg.policy).run(stop))


@app.command()
def stream(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    security: LogSecurityOpt = None,
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
    instance: Annotated[
        int,
        typer.Option(
            min=0,
            help=(
                "Which instance of the policy's stream processor this is (native runtime; see stream.instances): "
                "instances share the trajectories partitions, each with its own transactional id."
            ),
        ),
    ] = 0,
) -> None:
    """Stream processor: trajectories → filters and advantages → train samples."""
    from astraflow.infra.launch.process import run_component

    overrides = {"stream.runtime": runtime} if runtime else None
    cfg, directory = _component(config, run_dir, backend, bootstrap, overrides, security)
    cfg = _one_policy(cfg, policy)
    name = "stream" if instance == 0 else f"stream-{instance}"
    if cfg.stream_runtime() == "faust":
        if instance:
            raise typer.BadParameter(
                "several instances need the native runtime (--runtime native)", param_hint="--instance"
            )
        from astraflow.streams.runtimes.faust_runtime import FaustStreamProcessor

        run_component(name, cfg, directory, lambda ctx, stop: FaustStreamProcessor(ctx, cfg.policy).run(stop))
        return
    from astraflow.streams.runtimes.native import NativeStreamProcessor

    run_component(name, cfg, directory, lambda ctx, stop: NativeStreamProcessor(ctx, cfg.policy, instance).run(stop))


@app.command()
def train(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    security: LogSecurityOpt = None,
    policy: PolicyOpt = None,
    nproc: Annotated[
        Optional[int],
        typer.Option("--nproc", min=1, help="Trainer ranks on this machine (overrides train.world_size)."),
    ] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Machines the trainer's ranks run on.")] = 1,
    node_rank: Annotated[
        Optional[int],
        typer.Option("--node-rank", min=0, help="This machine's rank (static rendezvous at --rdzv-endpoint)."),
    ] = None,
    rdzv_endpoint: Annotated[
        Optional[str],
        typer.Option("--rdzv-endpoint", help="HOST:PORT where the machines' launchers meet (with --nnodes)."),
    ] = None,
) -> None:
    """Trainer: train samples → optimizer steps → weight versions; checkpoints and resumes. With several
    ranks (--nproc, train.world_size) it runs under torch.distributed.run and rank 0 writes the log."""
    from astraflow.training.distributed import Ranks, launched

    cfg, directory = _component(config, run_dir, backend, bootstrap, security=security)
    cfg = _one_policy(cfg, policy)
    if not launched() and ((nproc or cfg.train.world_size) > 1 or nnodes > 1):
        _launch_ranks(cfg, nproc or cfg.train.world_size, nnodes, node_rank, rdzv_endpoint)
        return
    ranks = Ranks.from_env()
    if not launched():
        _train_rank(cfg, directory, ranks)
        return
    from astraflow.infra.launch.ranks import follow_agent, run_then_exit

    follow_agent()
    run_then_exit(lambda: _train_rank(cfg, directory, ranks))  # no native teardown to hang in


def _train_rank(cfg, directory: Path, ranks) -> None:
    """Run this process's rank of the trainer until a stop signal: rank 0 the trainer, which writes the
    log, the others ``TrainerRank``, which follow it."""
    if ranks.leader:
        from astraflow.consumers.trainer.component import Trainer
        from astraflow.infra.launch.process import run_component

        run_component("train", cfg, directory, lambda ctx, stop: Trainer(ctx, cfg.policy, ranks).run(stop))
    else:
        from astraflow.consumers.trainer.ranks import TrainerRank
        from astraflow.infra.launch.process import run_rank

        run_rank(f"train-rank{ranks.rank}", directory, lambda stop: TrainerRank(cfg, directory, ranks).run(stop))


def _launch_ranks(cfg, nproc: int, nnodes: int, node_rank: Optional[int], rdzv_endpoint: Optional[str]) -> None:
    """Run this same command as the trainer's ranks under torch.distributed.run (``infra/launch/ranks.py``)."""
    import sys

    from astraflow.core.errors import ConfigError
    from astraflow.infra.launch.process import setup_logging
    from astraflow.infra.launch.ranks import RankLaunch, run_launcher

    if cfg.train.backend == "simulated":
        raise ConfigError(
            f"--nproc {nproc}: several ranks of train.backend 'simulated' are not supported; "
            "train.simulated.devices models data-parallel GPUs"
        )
    if cfg.train.backend == "deepspeed" and cfg.train.deepspeed.zero_stage == 0:
        raise ConfigError(
            f"--nproc {nproc}: several ranks of train.backend 'deepspeed' need train.deepspeed.zero_stage 1, 2 or 3 "
            "(stage 0 is plain data parallel: use train.backend 'torch', which is DDP)"
        )
    launch = RankLaunch(nproc, nnodes, node_rank, rdzv_endpoint, f"{cfg.run}.train.{cfg.policy}")
    try:
        launch.check()
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    setup_logging("train-launcher")
    run_launcher(launch, sys.argv[1:])


@app.command()
def evaluate(
    config: ConfigArg,
    run_dir: RunDirOpt = None,
    backend: BackendOpt = None,
    bootstrap: BootstrapOpt = None,
    security: LogSecurityOpt = None,
    policy: PolicyOpt = None,
    system: Annotated[
        bool,
        typer.Option(
            "--system", help="Evaluate the policies together (the workflow's system accuracy) instead of one policy."
        ),
    ] = False,
) -> None:
    """Evaluator: held-out greedy exact match of each new weight version → metrics topic."""
    from astraflow.infra.launch.process import run_component

    cfg, directory = _component(config, run_dir, backend, bootstrap, security=security)
    if system:
        from astraflow.consumers.evaluators.system import SystemEvaluator

        run_component("evaluate", cfg, directory, lambda ctx, stop: SystemEvaluator(ctx).run(stop))
        return
    from astraflow.consumers.evaluators.policy import Evaluator

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
    dashboard: Annotated[
        bool,
        typer.Option(help="Show the live dashboard on a terminal; without it, or off one, print a line every 10 s."),
    ] = True,
) -> None:
    """Run every component of CONFIG as its own process on one machine, then write the report."""
    from astraflow.infra.launch.launcher import launch

    overrides = {"stop.max_minutes": max_minutes} if max_minutes else None
    cfg, directory = _component(config, run_dir, backend, bootstrap, overrides)
    summary = launch(cfg, directory, dashboard=dashboard)
    typer.echo(f"run directory: {directory}")
    typer.echo(
        f"held-out accuracy {summary['base_accuracy']:.3f} -> {summary['final_accuracy']:.3f} "
        f"in {summary['versions']} versions, {summary['wall_seconds']:.0f} s"
    )
    for policy, final in summary["final_models"].items():
        where = f"{final['path']} (version {final['version']})" if "path" in final else final["error"]
        typer.echo(f"final model of {policy}: {where}")


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
    dashboard: Annotated[
        bool,
        typer.Option(help="Show the live dashboard on a terminal; without it, or off one, print a line every 10 s."),
    ] = True,
) -> None:
    from astraflow.infra.launch.replay import parse_time_ms
    from astraflow.infra.launch.replay import replay as replay_run
    from astraflow.runtime.attach import open_run

    overrides = {"stop.max_minutes": max_minutes} if max_minutes else None
    cfg, directory = _component(config, run_dir, backend, bootstrap, overrides)
    span = {
        "from_offset": from_offset,
        "since_ms": parse_time_ms(since, "--since") if since else None,
        "until_ms": parse_time_ms(until, "--until") if until else None,
    }
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
