"""Starting a trainer of several ranks: ``astraflow train --nproc N`` becomes PyTorch's elastic
launcher (``torch.distributed.run``) running N copies of the same command.

``astraflow train`` runs the launcher's agent in its own process (``run_launcher``), so the process
``astraflow run`` supervises, and signals, is the agent: SIGTERM reaches every rank through it (rank
0 finishes its step and checkpoints; the agent waits for that, then the command exits 0 as any
component stopped by a signal does), and a rank that dies makes it end the others and restart the
group (``--max-restarts``), which resumes from the last checkpoint; when the restarts are spent the
command fails, and ``astraflow run`` restarts it in turn. An agent killed outright cannot pass a
signal on: its ranks then stop by themselves (``follow_agent``). Each rank runs ``astraflow train`` again
with the same arguments (less ``LAUNCH_OPTIONS``); the launcher's environment tells it that it is a
rank (``training.distributed.launched``), so it does not launch again.

Rendezvous: one machine uses ``--standalone`` (a c10d store on a free local port). Several machines
(``--nnodes``) meet at ``--rdzv-endpoint HOST:PORT`` through the c10d rendezvous (any agent may be
first; the node ranks are assigned), or, with ``--node-rank``, through the static one, where
the endpoint is node 0's address.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

logger = logging.getLogger(__name__)

AGENT_PID = "ASTRAFLOW_TRAIN_AGENT_PID"
"""The environment variable that tells a rank the pid of the launcher agent that started it."""
PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal the kernel sends this process when its parent dies (Linux)."""
MAX_RESTARTS = 3
"""Restarts of the whole group the launcher makes after a rank failed, before it gives up (and
``astraflow run`` restarts it in turn)."""


@dataclass(frozen=True)
class RankLaunch:
    """How many ranks, on how many machines, meeting where."""

    nproc: int = 1
    """Ranks on this machine."""
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    run_id: str = "astraflow"
    """The rendezvous id: the same for every machine of one trainer."""

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def check(self) -> None:
        """A ``ValueError`` naming what is missing or wrong."""
        if self.nproc < 1 or self.nnodes < 1:
            raise ValueError(f"--nproc ({self.nproc}) and --nnodes ({self.nnodes}) must be at least 1")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"--nnodes {self.nnodes}: give --rdzv-endpoint HOST:PORT, where the machines meet")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} (--nnodes {self.nnodes})")


LAUNCH_OPTIONS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint")
"""The options of ``astraflow train`` that say how to launch: a rank needs none of them, and the
launcher's own parser would take ``--nproc`` for an ambiguous ``--nproc-per-node``."""


def rank_command(argv: list[str]) -> list[str]:
    """``argv`` (``astraflow`` arguments) without ``LAUNCH_OPTIONS`` and their values."""
    kept: list[str] = []
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument in LAUNCH_OPTIONS:
            skip = True
        elif not argument.startswith(tuple(f"{option}=" for option in LAUNCH_OPTIONS)):
            kept.append(argument)
    return kept


def launcher_argv(launch: RankLaunch, command: list[str], python: str = sys.executable) -> list[str]:
    """The ``torch.distributed.run`` command line that runs ``command`` (``astraflow`` arguments, less
    ``LAUNCH_OPTIONS``) as the ranks of ``launch``."""
    launch.check()
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(launch.nproc)]
    argv += ["--max-restarts", str(MAX_RESTARTS)]
    if launch.nnodes == 1 and not launch.rdzv_endpoint:
        argv += ["--standalone"]
    elif launch.node_rank is not None:
        argv += ["--nnodes", str(launch.nnodes), "--node-rank", str(launch.node_rank)]
        argv += ["--rdzv-backend", "static", "--rdzv-endpoint", launch.rdzv_endpoint or ""]
    else:
        argv += ["--nnodes", str(launch.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(launch.rdzv_endpoint)]
        argv += ["--rdzv-id", launch.run_id]
    return argv + ["-m", "astraflow.cli", *rank_command(command)]


def run_launcher(launch: RankLaunch, command: list[str]) -> NoReturn:
    """Run ``command`` as the ranks of ``launch`` under ``torch.distributed.run``'s agent, in this process,
    until the ranks exit, then exit this process: 0 when they finished or a stop signal (which the agent
    passes on to them) ended them, 1 when the launcher failed (its restarts spent).

    The process exits without finalising the interpreter (``exit_now``): after a stop signal torch
    leaves the c10d rendezvous' heartbeat running (closing the rendezvous would end it for the other
    machines too), a daemon thread that may be inside a call to the rendezvous store when the agent
    hosting that store exits first. The call then returns into a finalising interpreter, which ends
    the thread by unwinding its C++ frames, and the process aborts (SIGABRT) instead of exiting 0."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main

    from astraflow.infra.launch.process import exit_now

    argv = launcher_argv(launch, command)
    os.environ[AGENT_PID] = str(os.getpid())  # the ranks inherit it (``follow_agent``)
    logger.info("starting %d trainer ranks: %s", launch.nproc, " ".join(argv))
    code = 1
    try:
        main(argv[3:])  # what follows ``python -m torch.distributed.run``
        code = 0
    except SignalException as exc:
        logger.info("the trainer's ranks stopped on signal %s", exc.sigval)
        code = 0
    except BaseException:
        logger.exception("the trainer's launcher failed")
    exit_now(code)


def follow_agent() -> None:
    """In a rank: when the launcher agent that started it dies, stop as on a stop signal.

    An agent stopped by a signal passes it on to its ranks and waits for them; one killed outright
    (SIGKILL, the OOM killer) cannot, and its ranks used to train on, unseen, until a restarted
    trainer fenced rank 0. So each rank asks the kernel for SIGTERM when its parent dies
    (``PR_SET_PDEATHSIG``, Linux), and stops at once if the agent died before it asked."""
    agent = os.environ.get(AGENT_PID)
    if agent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        logger.warning("this rank will not stop with its agent: prctl failed (errno %d)", ctypes.get_errno())
    elif os.getppid() != int(agent):
        logger.error("the launcher agent (pid %s) is gone before this rank started; stopping", agent)
        raise SystemExit(1)


def run_then_exit(run: Callable[[], None]) -> NoReturn:
    """In a rank: ``run()``, then exit without finalising the interpreter (``exit_now``), with the status
    the command line would give: 0 when ``run`` returned, 2 after an AstraFlow error's one line, 1 after
    any other error's traceback, a ``SystemExit``'s as the interpreter takes it (none 0, a number
    itself, anything else printed and 1). Only a rank ending with 0 leaves its process group first; a
    failed one leaves it to the launcher, which ends the others (destroying a group a peer may still
    wait in is not a step to risk hanging in).

    A rank that had finished, its output written and its group destroyed, could still hang for ever
    in the process's exit (in one of 60 two-rank runs on 2 loaded cores here, and in a CI run): past
    the interpreter's finalisation, in the teardown of native code (faulthandler's watchdog, which
    finalisation cancels, did not fire), so a rank that will never do anything again kept its
    launcher waiting for it, and the trainer neither finished nor restarted. Leaving by ``os._exit``
    skips that teardown; what a rank must persist (checkpoints, rank 0's records) is written and
    flushed before ``run`` returns."""
    from astraflow.core.errors import AstraFlowError
    from astraflow.infra.launch.process import exit_now
    from astraflow.training.distributed import leave_group

    code = 1
    try:
        run()
        code = 0
    except AstraFlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        logger.exception("this rank failed")
    if code == 0:
        leave_group()
    exit_now(code)
