"""The sandbox contract: limits, the result of one run, the errors, and the backend ABC.

A sandbox runs one untrusted program (argv + files + stdin) in a fresh throwaway directory with
no network, a read-only system (only ``/usr`` and its siblings are visible; ``/etc``, ``/home``,
``/root`` and the caller's directories are not), none of the caller's environment, a seccomp
filter that keeps it from nested user namespaces and the kernel interfaces kept for root
(``seccomp.py``), and CPU / memory / process / file-size / wall limits: rlimits on each process
and, where the host lets us make cgroups, a cgroup per run (``cgroups.py``). ``enforcement()``
reports which of these are in force here. The two outcomes are kept apart on purpose:

- the *program* failed (non-zero exit, killed by a limit, timed out): a ``RunResult``, which a
  reward turns into a failed test;
- the *sandbox* failed (cannot start, the launcher never reached the program): ``SandboxError``,
  which fails the task (dead-lettered), never a silent zero reward.

How that is told apart: the launcher inside the sandbox writes ``ready`` to a status file just
before it ``exec``s the program, so a run without that line never reached the program.

A program's tests can share one sandbox (``run_python_tests``): the sandbox then runs
``tests_driver.py``, which forks a fresh process per test and writes ``driver-ready`` to the status
file before it runs any; a run without that line is a ``SandboxError`` too. Once the driver runs,
whatever the program does to it (kill it, garble its report) fails the program's tests.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from astraflow.sandbox import cgroups, seccomp
from astraflow.sandbox.cgroups import CgroupSetup
from astraflow.sandbox.enforcement import Enforcement, observe
from astraflow.sandbox.errors import SandboxError
from astraflow.sandbox.host import Gate, read_capped, start, throwaway_dir
from astraflow.sandbox.limits import SandboxLimits

WORKDIR = "/work"
PROGRAM_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
LAUNCHER = Path(__file__).with_name("launcher.py")
TESTS_DRIVER = Path(__file__).with_name("tests_driver.py")
REPORT_BYTES_PER_TEST = 512  # the JSON around one test's base64 outputs in the driver's report


@dataclass
class RunResult:
    """What one program run did; a failed or killed program is a result, not an error."""

    exit_code: int  # the program's status; 128 + N when signal N killed it
    stdout: str
    stderr: str
    timed_out: bool  # the wall limit was hit and the sandbox was killed
    wall_ms: float
    truncated: bool = False  # stdout or stderr was longer than max_output_bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def signal(self) -> int | None:
        """The signal that killed the program, when its status says so."""
        return self.exit_code - 128 if 128 < self.exit_code < 128 + 65 else None

    def describe(self) -> str:
        if self.timed_out:
            return f"timed out after {self.wall_ms / 1000:.1f} s"
        if self.signal is not None:
            return (
                f"killed by {signal.Signals(self.signal).name}"
                if self.signal in signal.valid_signals()
                else f"exit {self.exit_code}"
            )
        return f"exit {self.exit_code}"


class Sandbox(ABC):
    """Runs untrusted programs; backends differ only in the command that builds the isolation."""

    name: str

    def __init__(self, limits: SandboxLimits, python: str = "/usr/bin/python3") -> None:
        self.limits = limits
        self.python = python
        self.seccomp: bytes | None = seccomp.deny_filter(os.uname().machine)
        self.cgroups: CgroupSetup | None = cgroups.host_cgroups()
        self._enforcement: Enforcement | None = None

    def userns_guards(self) -> tuple[str, ...]:
        """The mechanisms this backend sets up against nested user namespaces."""
        return ("seccomp",) if self.seccomp else ()

    def enforcement(self) -> Enforcement:
        """What is enforced on this machine, observed once by a program in the sandbox (``enforcement.py``)."""
        if self._enforcement is None:
            self._enforcement = observe(self)
        return self._enforcement

    @abstractmethod
    def command(self, directory: Path, inputs: dict[str, Path], spec: dict) -> list[str]:
        """The host command that runs the launcher with ``spec`` inside this backend's isolation."""

    def run(
        self, argv: list[str], files: Mapping[str, str | bytes] | None = None, stdin: str | bytes = b""
    ) -> RunResult:
        """Run ``argv`` in ``/work`` holding ``files`` (name → content); ``SandboxError`` if it cannot run."""
        return self._run(argv, files or {}, stdin, self.limits, expect=("ready",))

    def run_python(self, source: str, stdin: str | bytes = b"") -> RunResult:
        """Run a Python program (the sandbox's system interpreter, isolated mode) as ``/work/main.py``."""
        return self.run([self.python, "-I", "main.py"], {"main.py": source}, stdin)

    def run_python_tests(self, source: str, stdins: Sequence[str | bytes]) -> list[RunResult]:
        """``run_python(source, stdin)`` for each of ``stdins``, in order, in as few sandboxes as fit.

        Each test keeps its own process and its own wall, CPU, memory, output and process limits
        (``tests_driver.py`` says how); the sandbox and the interpreter start once per batch. A
        batch holds as many tests as the driver's report fits under RLIMIT_FSIZE (every test of
        the code task), and its sandbox gets ``wall_seconds`` per test plus one more for start-up.
        """
        cap = self.limits.max_output_bytes
        report_bytes = 2 * 4 * -(-cap // 3) + REPORT_BYTES_PER_TEST  # two base64 outputs
        per_run = max(1, self.limits.max_file_mb * 1024 * 1024 // report_bytes)
        results: list[RunResult] = []
        for first in range(0, len(stdins), per_run):
            batch = stdins[first : first + per_run]
            limits = replace(
                self.limits,
                wall_seconds=(len(batch) + 1) * self.limits.wall_seconds,
                max_processes=self.limits.max_processes + 1,  # the driver is one of the sandbox's processes
                max_output_bytes=len(batch) * report_bytes,
            )
            config = {
                "tests": len(batch),
                "wall_seconds": self.limits.wall_seconds,
                "max_output_bytes": cap,
                "max_stream_bytes": self.limits.max_file_mb * 1024 * 1024,
            }
            files = {"main.py": source, "tests_driver.py": TESTS_DRIVER.read_text()} | {
                f"stdin-{i}": stdin for i, stdin in enumerate(batch)
            }
            run = self._run(
                [self.python, "-I", "tests_driver.py", json.dumps(config)],
                files,
                b"",
                limits,
                expect=("ready", "driver-ready"),
            )
            results += _parse_report(run, len(batch), cap)
        return results

    def _run(
        self,
        argv: list[str],
        files: Mapping[str, str | bytes],
        stdin: str | bytes,
        limits: SandboxLimits,
        expect: tuple[str, ...],
    ) -> RunResult:
        """Run ``argv`` under ``limits``; ``SandboxError`` unless the status file holds the lines of ``expect``.

        Steps: write the inputs to a throwaway host directory; make the run's cgroup (where the
        host has them); start the backend's command in its own session (and in that cgroup) with
        stdout / stderr going to files (the program's RLIMIT_FSIZE bounds them); wait up to
        ``wall_seconds``, then kill the session, which takes the sandbox's pid namespace and every
        process in it down; read the status lines, the outputs, and remove the cgroup and the
        directory. ``driver-ready`` in ``expect`` hands the status fd on to the tests driver.
        """
        directory = throwaway_dir()
        cgroup, gate = None, None
        try:
            if self.cgroups is not None:
                try:
                    cgroup = self.cgroups.create(limits)
                except OSError as exc:
                    raise SandboxError(f"{self.name}: cannot make the run's cgroup: {exc}") from exc
                gate = Gate()
            inputs, stdin_path = write_inputs(directory, files, stdin)
            with (
                open(directory / "stdout", "wb+") as fout,
                open(directory / "stderr", "wb+") as ferr,
                open(directory / "status", "wb+") as fstatus,
            ):
                spec = {
                    "status_fd": fstatus.fileno(),
                    "pass_status": "driver-ready" in expect,
                    "rlimits": limits.rlimits(),
                    "argv": argv,
                    "env": PROGRAM_ENV,
                    "cwd": WORKDIR,
                    "seccomp": self.seccomp.hex() if self.seccomp else None,
                    "gate_fd": gate.read_fd if gate else None,
                }
                command = self.command(directory, inputs, spec)
                started = time.perf_counter()
                try:
                    process = start(
                        command, stdin_path, fout, ferr, (fstatus.fileno(),) + ((gate.read_fd,) if gate else ())
                    )
                except OSError as exc:
                    raise SandboxError(f"{self.name}: cannot start {command[0]}: {exc}") from exc
                if gate is not None and cgroup is not None:
                    try:
                        gate.open_for(process, cgroup, limits.wall_seconds)
                    except OSError as exc:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait()
                        raise SandboxError(f"{self.name}: cannot put the run in its cgroup: {exc}") from exc
                timed_out = False
                try:
                    code = process.wait(timeout=limits.wall_seconds)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    os.killpg(process.pid, signal.SIGKILL)
                    code = process.wait()
                wall_ms = (time.perf_counter() - started) * 1000
                status = (directory / "status").read_text(errors="replace").splitlines()
                stdout, cut_out = read_capped(fout, limits.max_output_bytes)
                stderr, cut_err = read_capped(ferr, limits.max_output_bytes)
        finally:
            if gate is not None:
                gate.close()
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(directory, ignore_errors=True)
        failed = [line for line in status if line not in expect]
        missing = [line for line in expect if line not in status]
        if failed or (missing and not timed_out):
            raise SandboxError(
                f"{self.name}: the program did not run ({'; '.join(failed) or f'exit {code}, no {missing[0]!r}'}): "
                f"{stderr.strip()[-500:]}"
            )
        if missing:
            raise SandboxError(f"{self.name}: the sandbox did not start within {limits.wall_seconds} s")
        return RunResult(code, stdout, stderr, timed_out, wall_ms, cut_out or cut_err)

    def launcher_argv(self, spec: dict) -> list[str]:
        """The launcher run by the system interpreter inside the sandbox (see ``launcher.py``)."""
        return [self.python, "-I", "-S", "-c", LAUNCHER.read_text(), json.dumps(spec)]


def _parse_report(run: RunResult, tests: int, cap: int) -> list[RunResult]:
    """The tests driver's results; when its report is missing or invalid, every test failed."""
    try:
        entries = json.loads(run.stdout)["results"]
        results = [
            RunResult(
                int(e["exit_code"]),
                _decode(e["stdout"], cap),
                _decode(e["stderr"], cap),
                bool(e["timed_out"]),
                float(e["wall_ms"]),
                bool(e["truncated"]),
            )
            for e in entries
        ]
    except (ValueError, KeyError, TypeError):
        results = []
    if len(results) == tests and not run.truncated:
        return results
    why = f"the tests driver reported no results ({run.describe()}): {run.stderr.strip()[-300:]}"
    return [RunResult(run.exit_code or 1, "", why, run.timed_out, run.wall_ms, run.truncated) for _ in range(tests)]


def _decode(data: str, cap: int) -> str:
    return base64.b64decode(data, validate=True)[:cap].decode(errors="replace")


def write_inputs(directory: Path, files: Mapping[str, str | bytes], stdin: str | bytes) -> tuple[dict[str, Path], Path]:
    """Write the program's files and stdin under ``directory``; names must be plain file names."""
    paths = {}
    for name, content in files.items():
        if not name or "/" in name or name in (".", ".."):
            raise SandboxError(f"sandbox file names must be plain names, got {name!r}")
        path = directory / "in" / name
        path.parent.mkdir(exist_ok=True, mode=0o755)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(0o644)
        paths[name] = path
    stdin_path = directory / "stdin"
    stdin_path.write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
    return paths, stdin_path
