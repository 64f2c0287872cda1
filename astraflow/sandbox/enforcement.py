"""What a sandbox enforces on this machine, observed from inside it (``Sandbox.enforcement()``).

The sandbox runs ``SELF_CHECK`` once as an ordinary program and combines what it saw (its seccomp
filters, its network interfaces, whether it can make a user namespace, its rlimits) with what
the host set up for every run (the run's cgroup, see ``cgroups.py``). Observed rather than taken
from the configuration, so that what a host quietly lacks (an old bubblewrap, an architecture
without our filter, cgroups it does not let us make) shows as missing instead of as promised.
``open_sandbox`` logs the report; the tests check it against the kernel.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from pathlib import Path

from astraflow.sandbox.cgroups import HELPERS, MIB, CgroupSetup, memory_bytes
from astraflow.sandbox.errors import SandboxError
from astraflow.sandbox.limits import SandboxLimits

CLONE_NEWUSER = 0x10000000
SELF_CHECK = f"""\
import ctypes, json, resource, socket
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
userns = 0 if libc.unshare({CLONE_NEWUSER}) == 0 else ctypes.get_errno()
limits = ('RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_CPU')
print(json.dumps({{
    'seccomp_filters': int(status.get('Seccomp_filters', '-1')),
    'interfaces': sorted(name for _, name in socket.if_nameindex()),
    'userns_errno': userns,
    'rlimits': {{name: resource.getrlimit(getattr(resource, name))[0] for name in limits}},
}}))
"""


@dataclass(frozen=True)
class Enforcement:
    """The protections a sandbox's programs run under here; each limit names its mechanisms."""

    backend: str
    network_isolated: bool  # the program sees no interface but loopback (its own network namespace)
    seccomp: bool  # the deny-list filter of ``seccomp.py`` is on every process of the run
    userns_forbidden: tuple[str, ...]  # what refuses a nested user namespace; empty: one could be made
    cgroup: str | None  # "v2" / "v1": each run in a cgroup of its own; None: rlimits alone
    memory: tuple[str, ...]
    processes: tuple[str, ...]
    cpu: tuple[str, ...]

    def missing(self) -> list[str]:
        """The essentials this sandbox lacks here: isolation from the network, from nested user
        namespaces, and a memory limit of some kind."""
        wanted = {
            "network isolation": self.network_isolated,
            "no nested user namespaces": bool(self.userns_forbidden),
            "a memory limit": bool(self.memory),
        }
        return [name for name, present in wanted.items() if not present]

    def describe(self) -> str:
        return (
            f"{self.backend}: network {'loopback only' if self.network_isolated else 'REACHABLE'}; "
            f"seccomp {'on' if self.seccomp else 'off'}; nested user namespaces "
            f"{'refused by ' + ', '.join(self.userns_forbidden) if self.userns_forbidden else 'ALLOWED'}; "
            f"memory {', '.join(self.memory) or 'UNLIMITED'}; processes {', '.join(self.processes) or 'UNLIMITED'}; "
            f"cpu {', '.join(self.cpu) or 'UNLIMITED'}"
        )


def observe(
    name: str,
    stdout: str,
    stderr: str,
    described: str,
    seccomp_filter: bool,
    userns_guards: tuple[str, ...],
    setup: CgroupSetup | None,
    limits: SandboxLimits,
) -> Enforcement:
    """The report of backend ``name`` from what ``SELF_CHECK`` printed inside it (``stdout``) and what
    the backend set up: a seccomp filter or not, its guards against nested user namespaces, its
    cgroup and limits. ``SandboxError`` with the run (``described``) and ``stderr`` if it printed no report."""
    try:
        seen = json.loads(stdout)
    except ValueError as exc:
        raise SandboxError(f"{name}: the self-check failed ({described}): {stderr[-300:]}") from exc
    host_filters = _seccomp_filters(Path("/proc/self/status").read_text())
    seccomp = seccomp_filter and (seen["seccomp_filters"] > host_filters or host_filters < 0)
    guards = [guard for guard in userns_guards if guard != "seccomp" or seccomp]
    refused = seen["userns_errno"]
    rlimits = seen["rlimits"]
    version = f"cgroup {setup.version}" if setup else ""
    controllers = setup.controllers if setup else ()
    return Enforcement(
        backend=name,
        network_isolated=seen["interfaces"] == ["lo"],
        seccomp=seccomp,
        userns_forbidden=tuple(guards or [f"the kernel ({errno.errorcode.get(refused, refused)})"]) if refused else (),
        cgroup=setup.version if setup else None,
        memory=_named(
            ("memory" in controllers, f"{version} {memory_bytes(limits) // MIB} MiB for the whole run"),
            (rlimits["RLIMIT_AS"] >= 0, f"RLIMIT_AS {rlimits['RLIMIT_AS'] // MIB} MiB per process"),
        ),
        processes=_named(
            ("pids" in controllers, f"{version} {limits.max_processes + HELPERS} processes"),
            (rlimits["RLIMIT_NPROC"] >= 0, f"RLIMIT_NPROC {rlimits['RLIMIT_NPROC']}"),
        ),
        cpu=_named(
            ("cpu" in controllers, f"{version} {limits.cpus:g} CPU"),
            (rlimits["RLIMIT_CPU"] >= 0, f"RLIMIT_CPU {rlimits['RLIMIT_CPU']} s per process"),
        ),
    )


def _named(*entries: tuple[bool, str]) -> tuple[str, ...]:
    return tuple(text for present, text in entries if present)


def _seccomp_filters(status: str) -> int:
    """``Seccomp_filters`` of a ``/proc/<pid>/status`` text (-1 on kernels before 5.9, which lack it)."""
    for line in status.splitlines():
        if line.startswith("Seccomp_filters:"):
            return int(line.split(":", 1)[1])
    return -1
