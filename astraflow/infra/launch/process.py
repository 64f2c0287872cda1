"""Running one component as a process: config resolution, logging, signals, clean shutdown.

Every ``astraflow <component>`` command goes through ``run_component``: it resolves the config
(YAML plus command-line overrides), opens the component's context on the run's log, and runs the
component's loop until SIGTERM/SIGINT sets the stop event, then closes the producer (flushing
whatever is queued) and the log. Components never install signal handlers themselves. A component
whose log client is stuck in a call that never returned exits at once instead (``exit_if_stuck``).
The ranks of a trainer other than rank 0 go through ``run_rank``, which opens no log at all.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from astraflow.config import RunConfig, load_config
from astraflow.core.rundir import RunDir
from astraflow.log.kafka import stuck_clients
from astraflow.runtime.context import ComponentContext

logger = logging.getLogger(__name__)


def resolve_config(
    config: Path, backend: str | None, bootstrap: str | None, overrides: dict[str, object] | None = None
) -> RunConfig:
    """The YAML config with ``--backend``/``--bootstrap`` (and other dotted overrides) applied."""
    extra = dict(overrides or {})
    if backend:
        extra["log.backend"] = backend
    if bootstrap:
        extra["log.bootstrap"] = bootstrap
    return load_config(config, extra)


def setup_logging(component: str, run_dir: Path | None = None) -> None:
    """Log to stderr, and to ``run_dir/logs/{component}-{pid}.log`` when a run directory is known."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if run_dir is not None:
        RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(RunDir(run_dir).logs / f"{component}-{os.getpid()}.log"))
    level = os.environ.get("ASTRAFLOW_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {component} %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for loops that must finish their current step."""
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        logger.info("received signal %d, stopping after the current step", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def run_component(name: str, config: RunConfig, run_dir: Path, body: Callable[..., None]) -> None:
    """Open the component's context and run ``body(ctx, stop)`` until a stop signal."""
    setup_logging(name, run_dir)
    stop = stop_on_signals()
    ctx = ComponentContext(config, run_dir, name)
    try:
        body(ctx, stop)
    finally:
        exit_if_stuck(name)
        ctx.close()


def run_rank(name: str, run_dir: Path, body: Callable[[threading.Event], None]) -> None:
    """Run ``body(stop)`` as a trainer rank other than 0: logging and signals as a component's, but no
    context, so it opens no log and writes no record (``consumers/trainer/ranks.py``)."""
    setup_logging(name, run_dir)
    body(stop_on_signals())


def exit_if_stuck(name: str) -> None:
    """End the process now if a log client is stuck in a call (``log.stuck_clients``): closing the
    context would wait on that call for ever. Exit status 1, so the launcher restarts the component."""
    stuck = stuck_clients.stuck()
    if stuck:
        logger.error("%s exits without closing its log: %s never returned", name, "; ".join(stuck))
        exit_now(1)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` once its logs and standard streams are flushed, without
    finalising the interpreter (no ``atexit`` handlers, no module teardown)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
