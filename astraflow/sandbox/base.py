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
from astraflow.sandbox.enforcement import SELF_CHECK, Enforcement, observe
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
            result = self.run_python(SELF_CHECK)
            self._enforcement = observe(
                self.name,
                result.stdout,
                result.stderr,
                result.describe(),
                self.seccomp is not None,
                self.userns_guards(),
                self.cgroups,
                self.limits,
            )
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
        """``run_python(source, stdin)`` for each of ``stdins``, in order, in as few sandboxes as fit."""
        return self.run_python_programs([(source, stdins)])[0]

    def run_python_programs(self, programs: Sequence[tuple[str, Sequence[str | bytes]]]) -> list[list[RunResult]]:
        """``run_python_tests`` of each (source, stdins) of ``programs``, in as few sandboxes as fit.

        Each test keeps its own process and its own wall, CPU, memory, output and process limits,
        and each program finds the sandbox as the first one did (``tests_driver.py`` says how); the
        sandbox and the interpreter start once per batch. A batch holds as many tests as the driver's
        report fits under RLIMIT_FSIZE, and its sandbox gets ``wall_seconds`` per test plus one more
        for start-up. Where a program leaves the driver dead or the sandbox unclean, the programs
        after it run again in a fresh sandbox, so what one program does never reaches another's result.
        """
        cap = self.limits.max_output_bytes
        report_bytes = 2 * 4 * -(-cap // 3) + REPORT_BYTES_PER_TEST  # two base64 outputs
        budget = self.limits.max_file_mb * 1024 * 1024
        per_part = max(1, (budget - REPORT_BYTES_PER_TEST) // report_bytes)
        # a program with more tests than one report fits is split into parts, each run as a program
        parts = [
            (index, source, list(stdins[first : first + per_part]))
            for index, (source, stdins) in enumerate(programs)
            for first in range(0, len(stdins), per_part)
        ]
        results: list[list[RunResult]] = [[] for _ in programs]
        while parts:
            batch, size = [], 0
            for part in parts:
                cost = len(part[2]) * report_bytes + REPORT_BYTES_PER_TEST
                if batch and size + cost > budget:
                    break
                batch.append(part)
                size += cost
            reported = self._run_batch([(source, stdins) for _, source, stdins in batch], size, cap)
            for (index, _, _), part_results in zip(batch, reported, strict=False):
                results[index] += part_results
            parts = parts[max(1, len(reported)) :]
        return results

    def _run_batch(
        self, programs: list[tuple[str, list[str | bytes]]], report_size: int, cap: int
    ) -> list[list[RunResult]]:
        """One sandbox of the tests driver over ``programs``: the results of the first programs, up to
        the one that left the sandbox unclean, or up to and failing the one it has no results of."""
        tests = sum(len(stdins) for _, stdins in programs)
        if not tests:
            return [[] for _ in programs]
        limits = replace(
            self.limits,
            wall_seconds=(tests + 1) * self.limits.wall_seconds,
            max_processes=self.limits.max_processes + 1,  # the driver is one of the sandbox's processes
            max_output_bytes=report_size,
            # the driver's own CPU grows with the batch (~0.5 ms a test here); each test sets its own limit
            cpu_seconds=self.limits.cpu_seconds + -(-tests // 100),
        )
        config = {
            "cpu_seconds": self.limits.cpu_seconds,
            "wall_seconds": self.limits.wall_seconds,
            "max_output_bytes": cap,
            "max_stream_bytes": self.limits.max_file_mb * 1024 * 1024,
        }
        batch = {
            "programs": [{"source": _b64(source), "stdins": [_b64(s) for s in stdins]} for source, stdins in programs]
        }
        run = self._run(
            [self.python, "-I", "-c", TESTS_DRIVER.read_text(), json.dumps(config)],
            {},
            json.dumps(batch),
            limits,
            expect=("ready", "driver-ready"),
        )
        return _parse_report(run, [len(stdins) for _, stdins in programs], cap)

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


def _parse_report(run: RunResult, tests: list[int], cap: int) -> list[list[RunResult]]:
    """The tests driver's results, one line per program: those of the programs it reported on in
    order, up to the first unclean one; then, where it stopped short of that (killed, garbled,
    out of time), the next program with every test failed. The caller runs the rest again."""
    reported: list[list[RunResult]] = []
    for line in run.stdout.splitlines() if not run.truncated else []:
        try:
            entry = json.loads(line)
            results = [
                RunResult(
                    int(e["exit_code"]),
                    _decode(e["stdout"], cap),
                    _decode(e["stderr"], cap),
                    bool(e["timed_out"]),
                    float(e["wall_ms"]),
                    bool(e["truncated"]),
                )
                for e in entry["results"]
            ]
        except (ValueError, KeyError, TypeError):
            break
        if entry.get("program") != len(reported) or len(results) != tests[len(reported)]:
            break
        reported.append(results)
        if entry.get("clean") is not True or len(reported) == len(tests):
            return reported
    why = f"the tests driver reported no results ({run.describe()}): {run.stderr.strip()[-300:]}"
    failed = RunResult(run.exit_code or 1, "", why, run.timed_out, run.wall_ms, run.truncated)
    return [*reported, [failed for _ in range(tests[len(reported)])]]


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


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
