"""The bubblewrap backend (Debian's ``bubblewrap`` package): the preferred isolation.

Namespaces: user, pid, net (loopback only), ipc, uts, cgroup; with bubblewrap 0.8 or later
``--disable-userns`` also keeps the program from making user namespaces of its own (the seccomp
filter refuses them as well, so an older bubblewrap is still covered). Filesystem: a fresh root
holding read-only binds of the system directories (``host.SYSTEM_PATHS``), a size-limited tmpfs
``/work`` (the program's throwaway directory, input files bound read-only into it) and ``/tmp``,
``/proc`` of the new pid namespace and a minimal ``/dev``; the root itself is remounted read-only.
``--die-with-parent`` ties the sandbox to the bwrap process the caller kills on a timeout, and
``--new-session`` keeps the program off the caller's terminal. ``--as-pid-1``: the launcher is
the namespace's init, as with ``unshare``, so the host finds it as bwrap's child to put it in the
run's cgroup (``host.Gate``).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

from astraflow.sandbox.base import WORKDIR, Sandbox
from astraflow.sandbox.host import system_mounts


@functools.lru_cache(maxsize=8)
def supports_disable_userns(binary: str) -> bool:
    """Whether ``binary`` knows ``--disable-userns`` (bubblewrap 0.8, 2023)."""
    try:
        usage = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--disable-userns" in usage.stdout


class BwrapSandbox(Sandbox):
    name = "bwrap"

    def __init__(self, *args, binary: str = "bwrap", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.binary = shutil.which(binary) or binary
        self.disable_userns = supports_disable_userns(self.binary)

    def userns_guards(self) -> tuple[str, ...]:
        return ("bwrap --disable-userns",) * self.disable_userns + super().userns_guards()

    def command(self, directory: Path, inputs: dict[str, Path], spec: dict) -> list[str]:
        size = str(self.limits.max_file_mb * 1024 * 1024)
        binds, links = system_mounts()
        argv = [
            self.binary,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--hostname",
            "sandbox",
            "--clearenv",
        ]
        if self.disable_userns:
            argv += ["--unshare-user", "--disable-userns"]
        for path in binds:
            argv += ["--ro-bind", path, path]
        for link, target in links.items():
            argv += ["--symlink", target, link]
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            size,
            "--tmpfs",
            "/tmp",
            "--size",
            size,
            "--tmpfs",
            WORKDIR,
        ]
        for name, path in inputs.items():
            argv += ["--ro-bind", str(path), f"{WORKDIR}/{name}"]
        argv += ["--remount-ro", "/", "--chdir", WORKDIR, "--setenv", "PATH", "/usr/bin:/bin"]
        return argv + self.launcher_argv(spec)
