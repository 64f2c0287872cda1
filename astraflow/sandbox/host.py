"""The host side of one run: its throwaway directory, the process that starts the backend, its cgroup.

Every function here raises ``OSError`` and leaves the wording of a ``SandboxError`` to ``base``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from astraflow.sandbox.cgroups import RunCgroup

SANDBOX_UID = 65534  # nobody: a root caller drops to it, so the kernel enforces RLIMIT_NPROC
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")  # no /etc, /home, /root, /tmp
HOST_ENV = {"PATH": "/usr/bin:/bin"}  # all the backend gets of ours: a secret in our environment stays here


def start(command: list[str], stdin: Path, stdout, stderr, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """Start ``command`` in a session of its own, as the sandbox user, with none of our environment."""
    with open(stdin, "rb") as fin:
        return subprocess.Popen(
            command,
            stdin=fin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=pass_fds,
            start_new_session=True,
            env=HOST_ENV,
            **drop_privileges(),
        )


class Gate:
    """The pipe on which the launcher waits (``gate_fd`` of its spec) until its cgroup holds it.

    Why not move the backend's process as soon as it starts: it forks right away, and a move
    takes one process, not the children it already has. Why not hold it before it starts (a
    shell that waits, then ``exec``s the backend): moving a process waits out an RCU grace
    period (5-10 ms here), and the run would wait with it. So the run's first process in the
    sandbox, the launcher (pid 1 of both backends), is moved while it starts its interpreter and
    builds the sandbox, and it waits here only before it forks the program; everything the
    program starts is in the cgroup, the backend's own small process (bwrap's monitor,
    ``unshare``) is not.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def open_for(self, process: subprocess.Popen, cgroup: RunCgroup, timeout: float) -> None:
        """Put ``process``'s child (the launcher) in ``cgroup``, then let it go on.

        A backend that exits before it has a child, or a child gone before the move or before
        the gate opens (the write then finds no reader: ``EPIPE``), never reached the program:
        the run then fails as a ``SandboxError`` without ``ready``.
        """
        self._close_read()
        launcher = first_child(process, timeout)
        try:
            if launcher is not None:
                cgroup.enter(launcher)
                os.write(self.write_fd, b"1")
        except (ProcessLookupError, BrokenPipeError):
            pass  # the launcher is gone already (cannot start): the run fails without "ready"
        finally:
            self.close()

    def close(self) -> None:
        """Close both ends; an unwritten gate makes the launcher give up (``setup-failed``)."""
        self._close_read()
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _close_read(self) -> None:
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


def first_child(process: subprocess.Popen, timeout: float) -> int | None:
    """The pid of ``process``'s first child once it has one, or ``None`` if it exits first.

    ``OSError`` (``ETIMEDOUT``) if it has none within ``timeout`` while it still runs.
    """
    path = f"/proc/{process.pid}/task/{process.pid}/children"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as children:
                found = children.read().split()
        except FileNotFoundError:
            return None
        if found:
            return int(found[0])
        if process.poll() is not None:
            return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.args[0]} started no sandbox within {timeout} s")
        time.sleep(0.0005)


def read_capped(handle, limit: int) -> tuple[str, bool]:
    """The first ``limit`` bytes of an output file as text, and whether there was more."""
    handle.seek(0)
    data = handle.read(limit + 1)
    return data[:limit].decode(errors="replace"), len(data) > limit


def system_mounts() -> tuple[list[str], dict[str, str]]:
    """The read-only system the program sees: directories to bind, and the symlinks among them."""
    binds, links = [], {}
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            binds.append(path)
    return binds, links


def throwaway_dir() -> Path:
    """A fresh host directory the sandbox user can read (for the program's input files)."""
    path = Path(tempfile.mkdtemp(prefix="astraflow-sandbox-"))
    path.chmod(0o755)
    return path


def drop_privileges() -> dict[str, object]:
    """``subprocess.Popen`` keyword arguments that run a root caller's sandbox as ``nobody``.

    As root, the sandboxed processes would map to the host's uid 0, for which the kernel skips
    RLIMIT_NPROC (a fork bomb would not be contained) and owner checks pass on root's files.
    """
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
