"""Run model-generated programs with no network, a read-only system and kernel-enforced limits.

``open_sandbox`` picks the backend named by the config (``auto``: bubblewrap, else ``unshare``)
and proves it works by running a trivial program once, alone and as a test batch (the tests
driver needs Python 3.9+ and pidfds in the sandbox); with no working backend it raises
``SandboxUnavailableError`` saying what to install, and no program is ever run unsandboxed.
The sandbox it returns has reported what it enforces here (``Sandbox.enforcement()``), and the
report is logged: a warning names any essential it lacks (network isolation, no nested user
namespaces, a memory limit).
"""

from __future__ import annotations

import logging

from astraflow.sandbox.base import RunResult, Sandbox
from astraflow.sandbox.bwrap import BwrapSandbox
from astraflow.sandbox.enforcement import Enforcement
from astraflow.sandbox.errors import SandboxError, SandboxUnavailableError
from astraflow.sandbox.limits import SandboxLimits
from astraflow.sandbox.unshare import UnshareSandbox

log = logging.getLogger(__name__)
BACKENDS: dict[str, type[Sandbox]] = {"bwrap": BwrapSandbox, "unshare": UnshareSandbox}
HINT = (
    "install bubblewrap (apt-get install bubblewrap) or allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1)"
)


def probe(sandbox: Sandbox) -> str | None:
    """Why ``sandbox`` cannot run programs here, or ``None`` when a trivial program runs in it."""
    try:
        results = [sandbox.run_python("print('ok')"), *sandbox.run_python_tests("print(input())", ["ok"])]
    except SandboxError as exc:
        return str(exc)
    failed = [result for result in results if not (result.ok and result.stdout == "ok\n")]
    return (
        None
        if not failed
        else f"{sandbox.name}: the probe program failed ({failed[0].describe()}): {failed[0].stderr[-300:]}"
    )


def open_sandbox(
    backend: str = "auto", limits: SandboxLimits = SandboxLimits(), python: str = "/usr/bin/python3"
) -> Sandbox:
    """A working sandbox of ``backend`` (``auto``, ``bwrap`` or ``unshare``), or ``SandboxUnavailableError``."""
    names = list(BACKENDS) if backend == "auto" else [backend]
    if any(name not in BACKENDS for name in names):
        raise SandboxUnavailableError(f"sandbox backend {backend!r} is unknown; choose auto, bwrap or unshare")
    problems = []
    for name in names:
        sandbox = BACKENDS[name](limits, python=python)
        problem = probe(sandbox)
        if problem is None:
            try:
                report = sandbox.enforcement()
            except SandboxError as exc:
                problems.append(str(exc))
                continue
            log.info("sandbox %s", report.describe())
            if report.missing():
                log.warning("sandbox %s lacks %s on this machine", name, ", ".join(report.missing()))
            return sandbox
        problems.append(problem)
    raise SandboxUnavailableError(f"no sandbox backend works ({'; '.join(problems)}): {HINT}")


__all__ = [
    "BACKENDS",
    "BwrapSandbox",
    "Enforcement",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxUnavailableError",
    "UnshareSandbox",
    "open_sandbox",
    "probe",
]
