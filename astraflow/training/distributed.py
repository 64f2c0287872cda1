"""A trainer of several ranks: who it is, its process group, each rank's share of a batch, and the
commands rank 0 sends the others.

``astraflow train --nproc N`` (or ``train.world_size: N``) runs the trainer as N processes under
PyTorch's elastic launcher (``torch.distributed.run``), which sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (``Ranks.from_env``). Rank 0 is the trainer of a single-rank run: it alone reads the
samples, assembles each batch, and writes to the log (weights, ledger, offsets, metrics). The other
ranks never open the log; they follow ``Command``\\ s that rank 0 broadcasts (``CommandChannel``),
in the order rank 0 runs the collectives they stand for:

- ``restore``: the checkpoint directory every rank loads (or none) and the version to start from;
- ``step``: the whole batch, in its agreed order, with each sample's (partition, offset, id); every
  rank trains ``share(len(batch), rank, world)`` of it (``PolicyTrainer.step``);
- ``publish`` / ``checkpoint``: gather the full weights (and optimizer state) of a sharded model;
- ``idle``: rank 0 is waiting for samples (sent every ``KEEPALIVE_S``, so no collective times out);
- ``stop``: the run is over.

The process group is gloo on CPU and NCCL where a CUDA GPU is visible (``group_backend``).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from astraflow.core.ports import free_port

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

KEEPALIVE_S = 60.0
"""Rank 0 waiting for samples tells the other ranks so at least this often."""
GROUP_TIMEOUT = timedelta(minutes=30)
"""How long a collective may wait for a rank: far above ``KEEPALIVE_S`` and a step's time."""
STORE_KEY = "astraflow/trainer-store"
"""The key of the launcher's store under which rank 0 leaves the address of the store of its start."""
TOKEN_KEY = "astraflow/trainer-store-token"
"""The key in rank 0's store of the token that tells the other ranks the store is this start's."""
STORE_PROBE = timedelta(seconds=3)
"""How long a rank tries to reach the store an address names before it reads the address again."""
LAUNCHER_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK")
"""What ``torch.distributed.run`` sets in every rank's environment."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the trainer: ``rank`` of ``world_size``, ``local_rank`` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def leader(self) -> bool:
        """Rank 0: the only rank that reads samples and writes to the log."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls) -> Ranks:
        """The ranks ``torch.distributed.run`` set; a world of one outside it."""
        return cls(
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")),
        )


SINGLE = Ranks()
"""The trainer of one process."""


def launched() -> bool:
    """Whether this process is a rank started by ``torch.distributed.run``."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def group_backend() -> str:
    """``nccl`` where a CUDA GPU is visible, else ``gloo``."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def rank_device(ranks: Ranks) -> torch.device:
    """The device a rank trains on: its own GPU (``cuda:LOCAL_RANK``) where there are GPUs, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", ranks.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_group(ranks: Ranks) -> None:
    """Join the default process group of ``ranks`` (once); a world of one on loopback outside a launcher,
    for the backends that need a group whatever the world size (FSDP2)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if not launched():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port())
        for name, value in {"RANK": ranks.rank, "WORLD_SIZE": ranks.world_size, "LOCAL_RANK": ranks.local_rank}.items():
            os.environ.setdefault(name, str(value))
    backend = group_backend()
    if backend == "nccl":
        torch.cuda.set_device(rank_device(ranks))
    store = start_store(ranks)
    dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.world_size, timeout=GROUP_TIMEOUT)
    atexit.register(leave_group)
    logger.info("rank %d of %d joined its %s process group", ranks.rank, ranks.world_size, backend)


def leave_group() -> None:
    """Destroy the process group while the interpreter is still whole: left to the interpreter's
    teardown, gloo's worker threads could still hold work with tensors whose release then needs the
    GIL, and the rank aborted (``terminate called without an active exception``, SIGABRT) after it
    had finished, which its launcher counts as a failure (pytorch#179291)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def start_store(ranks: Ranks) -> Any:
    """The store the ranks of this start of the trainer meet in, hosted by rank 0 (a ``TCPStore``).

    The launcher's own store outlives a start: when a rank dies and the launcher restarts the group,
    the keys the last start's process group wrote (each rank's gloo address) are still there, and a
    new rank that read one before its peer rewrote it connected to a dead process (``Gloo
    connectFullMesh failed ... Connection refused``) and failed the restart. So rank 0 hosts a store
    of its own, which dies with it, and leaves its address in the launcher's store; the others take
    an address that no longer answers for the last start's and read it again until this start's
    rank 0 has written it.

    An address is tried with a plain socket before ``TCPStore`` connects to it: ``TCPStore``'s own
    connection retries to a port nothing listens on can meet themselves (Linux may give the
    connecting socket that very port, a TCP self-connect), and its client then aborted the process
    (``terminate called without an active exception``) instead of raising. And rank 0 leaves a
    token in its store that the others check, so a port some other process listens on by now is
    not taken for this start's store."""
    import torch.distributed as dist
    from torch.distributed.rendezvous import rendezvous

    if not ranks.distributed and not launched():
        return dist.HashStore()  # a world of one outside a launcher: no one to meet, no port to open
    launcher, _rank, _world = next(
        rendezvous("env://", rank=ranks.rank, world_size=ranks.world_size, timeout=GROUP_TIMEOUT)
    )
    if ranks.leader:
        own = dist.TCPStore(
            "0.0.0.0", 0, ranks.world_size, is_master=True, timeout=GROUP_TIMEOUT, wait_for_workers=False
        )
        token = os.urandom(8).hex()
        own.set(TOKEN_KEY, token)
        launcher.set(STORE_KEY, f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{own.port}:{token}")
        return own
    deadline = time.monotonic() + GROUP_TIMEOUT.total_seconds()
    while True:
        host, port, token = launcher.get(STORE_KEY).decode().rsplit(":", 2)
        store = _join_store(host, int(port), token, ranks.world_size)
        if store is not None:
            return store
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {ranks.rank}: no store of this start's rank 0 answered in {GROUP_TIMEOUT}")
        logger.info("rank %d: no store of this start answers at %s:%s (a previous start's?)", ranks.rank, host, port)
        time.sleep(0.5)


def _listening(host: str, port: int) -> bool:
    """Whether another socket listens at ``host:port``: one plain connection, a self-connect counting as no."""
    try:
        with socket.create_connection((host, port), timeout=STORE_PROBE.total_seconds()) as probe:
            return probe.getsockname() != probe.getpeername()
    except OSError:
        return False


def _join_store(host: str, port: int, token: str, world_size: int) -> Any:
    """A client of the store at ``host:port`` if it is the one that left ``token``, else None."""
    import torch.distributed as dist

    if not _listening(host, port):
        return None
    try:
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=STORE_PROBE)
        if store.check([TOKEN_KEY]) and store.get(TOKEN_KEY).decode() == token:
            store.set_timeout(GROUP_TIMEOUT)
            return store
    except RuntimeError:  # DistNetworkError or a store that is not ours
        pass
    return None


def share(count: int, rank: int, world_size: int) -> range:
    """The indices of a batch of ``count`` samples that ``rank`` trains: contiguous, in the batch's order,
    the first ``count % world_size`` ranks one more. The shares of all ranks are disjoint and cover the
    batch, so no sample is trained twice or skipped; a rank past the end of a small batch gets none."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    base, extra = divmod(count, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def all_reduce_sum(values: list[float], ranks: Ranks) -> list[float]:
    """The element-wise sum of ``values`` over every rank (``values`` itself in a world of one)."""
    if not ranks.distributed:
        return values
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=rank_device(ranks))
    dist.all_reduce(tensor)
    return tensor.tolist()


@dataclass
class Command:
    """One instruction of rank 0 to the other ranks (see the module docstring)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


class CommandChannel:
    """Rank 0 ``send``\\ s commands, every other rank ``receive``\\ s them in the same order.

    In a world of one ``send`` does nothing, so the single-rank trainer runs the same code.
    """

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self._last_sent = time.monotonic()

    def send(self, name: str, **args: Any) -> None:
        if not self.ranks.leader:
            raise RuntimeError(f"rank {self.ranks.rank} sent command {name!r}; only rank 0 sends commands")
        if self.ranks.distributed:
            self._broadcast(Command(name, args))
            self._last_sent = time.monotonic()

    def keepalive(self) -> None:
        """Tell the other ranks that rank 0 is still waiting for samples, at most every ``KEEPALIVE_S``."""
        if self.ranks.distributed and time.monotonic() - self._last_sent >= KEEPALIVE_S:
            self.send("idle")

    def receive(self) -> Command:
        if self.ranks.leader:
            raise RuntimeError("rank 0 sends commands; it never receives one")
        return self._broadcast(None)

    def _broadcast(self, command: Command | None) -> Command:
        import torch.distributed as dist

        box = [command]
        dist.broadcast_object_list(box, src=0, device=rank_device(self.ranks))
        return box[0]
