"""The limits of one run, which the launcher (rlimits) and the run's cgroup (``cgroups.py``) enforce."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits; every one of them is enforced by the kernel, not by the program."""

    wall_seconds: float = 5.0  # the whole sandbox (every process in it) is killed after this
    cpu_seconds: int = 2  # RLIMIT_CPU of each process (SIGXCPU, then SIGKILL one second later)
    memory_mb: int = 256  # RLIMIT_AS of each process
    max_processes: int = 16  # RLIMIT_NPROC inside the sandbox's user namespace
    max_file_mb: int = 8  # RLIMIT_FSIZE, and the size of the /work and /tmp tmpfs
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 64 * 1024  # stdout / stderr kept (the rest is cut, and reported)
    cpus: float = 1.0  # CPU bandwidth of the whole run, where it has a cgroup with the cpu controller

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """The ``resource`` limits the launcher sets on the program, by name."""
        mib = 1024 * 1024
        return {
            "RLIMIT_CPU": (self.cpu_seconds, self.cpu_seconds + 1),
            "RLIMIT_AS": (self.memory_mb * mib, self.memory_mb * mib),
            "RLIMIT_NPROC": (self.max_processes, self.max_processes),
            "RLIMIT_FSIZE": (self.max_file_mb * mib, self.max_file_mb * mib),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
            "RLIMIT_CORE": (0, 0),
        }
