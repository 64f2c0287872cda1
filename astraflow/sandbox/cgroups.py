"""Per-run cgroups: memory, processes and CPU of a whole sandbox, where the host lets us make them.

Why: rlimits are per process. RLIMIT_AS bounds each process, so a program that forks N of them
may hold N times it, and its tmpfs ``/work`` and ``/tmp`` are memory no rlimit sees. A cgroup
bounds the run as one: the launcher, the program and whatever it starts, and the tmpfs pages
they write.

Where (``host_cgroups``, decided once per process by making and removing a trial cgroup):

- cgroup v2 with the ``memory`` and ``pids`` controllers: the directory named by
  ``ASTRAFLOW_SANDBOX_CGROUP`` (a delegated subtree; ``none`` turns cgroups off), else this
  process's own cgroup, else the top of the hierarchy as mounted here; the first whose children
  can get both controllers (the kernel allows that only in the root cgroup or in one without
  processes of its own);
- cgroup v1 (hybrid hosts, where ``memory`` and ``pids`` live in v1 hierarchies): this process's
  own cgroup in the ``memory``, ``pids`` and, if writable, ``cpu`` hierarchies;
- otherwise none: rlimits alone, and ``Sandbox.enforcement()`` says so.

Each run gets ``astraflow-sandbox-<pid>-<n>`` under those parents with: memory of ``memory_mb``
plus both tmpfs plus ``SLACK_MB`` for the launcher and kernel memory, no swap; ``max_processes``
plus the launcher; ``cpus`` CPUs of bandwidth. The launcher joins it before it forks the program
(``host.Gate``), so every process the program starts is inside. After the run what is left is
killed (``cgroup.kill``, v2) and the cgroup removed; one left by a host process that died is
removed by the next ``host_cgroups`` of any process.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from astraflow.sandbox.limits import SandboxLimits

log = logging.getLogger(__name__)

PREFIX = "astraflow-sandbox-"
OVERRIDE = "ASTRAFLOW_SANDBOX_CGROUP"
HELPERS = 1  # the launcher, which stays as the pid namespace's init
SLACK_MB = 16  # the launcher (an interpreter, staying as init) and kernel memory
CPU_PERIOD_US = 100_000
REMOVE_SECONDS = 5.0
MIB = 1024 * 1024
_runs = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    """One directory under which a run's cgroup is made, and the controllers it gives the run."""

    parent: Path
    controllers: tuple[str, ...]


@dataclass(frozen=True)
class CgroupSetup:
    """Where this host makes a run's cgroup: ``v2`` (one hierarchy) or ``v1`` (one per controller)."""

    version: str
    hierarchies: tuple[Hierarchy, ...]

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(sorted(c for h in self.hierarchies for c in h.controllers))

    def settings(self, limits: SandboxLimits) -> dict[str, dict[str, str]]:
        """The files each controller writes in a run's cgroup (optional ones only where they exist)."""
        memory = str(memory_bytes(limits))
        pids = str(limits.max_processes + HELPERS)
        quota = str(max(1000, int(limits.cpus * CPU_PERIOD_US)))
        if self.version == "v2":
            return {
                "memory": {"memory.max": memory, "memory.swap.max": "0"},
                "pids": {"pids.max": pids},
                "cpu": {"cpu.max": f"{quota} {CPU_PERIOD_US}"},
            }
        return {
            "memory": {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory},
            "pids": {"pids.max": pids},
            "cpu": {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": quota},
        }

    def create(self, limits: SandboxLimits) -> RunCgroup:
        """A fresh cgroup with ``limits`` for one run; ``OSError`` when the kernel refuses."""
        name = f"{PREFIX}{os.getpid()}-{next(_runs)}"
        settings = self.settings(limits)
        run = RunCgroup(self.version, [])
        try:
            for hierarchy in self.hierarchies:
                path = hierarchy.parent / name
                path.mkdir()
                run.paths.append(path)
                for controller in hierarchy.controllers:
                    for file, value in settings[controller].items():
                        if file in ("memory.swap.max", "memory.memsw.limit_in_bytes") and not (path / file).exists():
                            continue  # no swap accounting on this kernel
                        (path / file).write_text(value)
        except OSError:
            run.remove()
            raise
        return run


@dataclass
class RunCgroup:
    """The cgroup (one directory per hierarchy) of one run."""

    version: str
    paths: list[Path]

    def enter(self, pid: int) -> None:
        """Move process ``pid`` (which has not started anything yet) into this cgroup."""
        for path in self.paths:
            (path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Kill what is left in the cgroup (v2) and remove it, waiting for its processes to go."""
        deadline = time.monotonic() + REMOVE_SECONDS
        for path in self.paths:
            if self.version == "v2" and (path / "cgroup.kill").exists():
                try:
                    (path / "cgroup.kill").write_text("1")
                except OSError as exc:
                    log.debug("cgroup.kill of %s: %s", path, exc)
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("sandbox cgroup %s not removed: %s", path, exc)
                        break
                    time.sleep(0.005)


def memory_bytes(limits: SandboxLimits) -> int:
    """The memory of a whole run: the program's, both tmpfs, and the launcher's."""
    return (limits.memory_mb + 2 * limits.max_file_mb + SLACK_MB) * MIB


def parse_mounts(mountinfo: str) -> list[tuple[str, Path, str, set[str]]]:
    """``(fstype, mount point, root inside the hierarchy, super options)`` of each cgroup mount."""
    mounts = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            mountpoint = Path(fields[4].replace("\\040", " "))
            mounts.append((tail[0], mountpoint, fields[3], set(tail[2].split(","))))
    return mounts


def parse_own(proc_cgroup: str) -> dict[str, str]:
    """This process's cgroup path by controller (``""`` for the v2 hierarchy)."""
    own = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _inside(mountpoint: Path, root: str, path: str) -> Path | None:
    relative = os.path.relpath(path, root)
    return None if relative.startswith("..") else (mountpoint / relative).resolve()


def candidates(mountinfo: str, proc_cgroup: str, override: str | None) -> list[CgroupSetup]:
    """Setups to try, best first, from the text of ``/proc/self/mountinfo`` and ``/proc/self/cgroup``."""
    if override == "none":
        return []
    mounts, own = parse_mounts(mountinfo), parse_own(proc_cgroup)
    found = [CgroupSetup("v2", (Hierarchy(Path(override), ()),))] if override else []
    for fstype, mountpoint, root, _ in mounts:
        if fstype == "cgroup2":
            mine = _inside(mountpoint, root, own[""]) if "" in own else None
            found += [CgroupSetup("v2", (Hierarchy(path, ()),)) for path in (mine, mountpoint) if path]
    v1: dict[Path, tuple[str, ...]] = {}  # one directory may hold several controllers (cpu,cpuacct)
    for controller in ("memory", "pids", "cpu"):
        for fstype, mountpoint, root, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                path = _inside(mountpoint, root, own[controller])
                if path is not None and os.access(path, os.W_OK):
                    v1[path] = (*v1.get(path, ()), controller)
    if {"memory", "pids"} <= {c for controllers in v1.values() for c in controllers}:
        found.append(CgroupSetup("v1", tuple(Hierarchy(path, controllers) for path, controllers in v1.items())))
        without_cpu = {path: tuple(c for c in cs if c != "cpu") for path, cs in v1.items()}
        if without_cpu != v1:  # a cpu controller that refuses its quota costs the CPU limit alone
            found.append(CgroupSetup("v1", tuple(Hierarchy(p, cs) for p, cs in without_cpu.items() if cs)))
    return found


def enable_v2(parent: Path) -> Hierarchy:
    """The controllers ``parent``'s children get (memory and pids at least), enabling them if needed."""
    available = set((parent / "cgroup.controllers").read_text().split())
    wanted = {"memory", "pids", "cpu"} & available
    if not {"memory", "pids"} <= wanted:
        raise OSError(errno.ENOTSUP, f"{parent}: no memory and pids controllers ({' '.join(sorted(available))})")
    for controller in sorted(wanted - set((parent / "cgroup.subtree_control").read_text().split())):
        try:
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError:
            if controller != "cpu":
                raise
            wanted.discard("cpu")
    return Hierarchy(parent, tuple(sorted(wanted)))


def sweep(setup: CgroupSetup) -> None:
    """Remove the empty run cgroups that host processes which no longer run left behind."""
    for hierarchy in setup.hierarchies:
        for path in hierarchy.parent.glob(f"{PREFIX}*"):
            try:
                os.kill(int(path.name[len(PREFIX) :].split("-")[0]), 0)
            except ProcessLookupError:
                try:
                    path.rmdir()
                except OSError as exc:
                    log.debug("left-over sandbox cgroup %s stays: %s", path, exc)
            except (ValueError, PermissionError):
                continue


@functools.lru_cache(maxsize=1)
def host_cgroups() -> CgroupSetup | None:
    """The first setup where a trial cgroup with every limit can be made and removed, or ``None``."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        log.info("sandbox: no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN), so no cgroups; limits are rlimits")
        return None  # host.Gate finds the launcher there
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        log.info("sandbox: no cgroups (%s); limits are rlimits", exc)
        return None
    for setup in candidates(mountinfo, proc_cgroup, os.environ.get(OVERRIDE)):
        try:
            if setup.version == "v2":
                setup = CgroupSetup("v2", (enable_v2(setup.hierarchies[0].parent),))
            setup.create(SandboxLimits()).remove()
        except OSError as exc:
            log.debug("sandbox cgroup %s %s unusable: %s", setup.version, setup.hierarchies[0].parent, exc)
            continue
        sweep(setup)
        return setup
    log.info("sandbox: no usable cgroup here; limits are rlimits")
    return None
