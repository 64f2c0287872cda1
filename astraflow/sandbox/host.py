"""The host side of one run: its throwaway directory and the process that starts the backend.

Every function here raises ``OSError`` and leaves the wording of a ``SandboxError`` to ``base``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

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
