"""The sandbox contains escape attempts and tells program failures from sandbox failures.

Every test runs on each backend (bubblewrap, unshare); a backend that does not work here is
skipped with the probe's reason, except under ``CI=true``, where it fails (``sandboxes.working``).
Escape attempts: network (a TCP server of the test on the host's loopback, and an outside
address), writing outside the throwaway dir, reading host files (/etc/shadow, /root, /home, the
repository, a secret in the test's tmp dir), a fork bomb, an infinite loop, a memory hog, an
output flood; each is contained, reported in the result, and leaves nothing behind on the host.
``test_sandbox_hardening.py`` has the rest: the host's environment, nested user namespaces,
ptrace and the other kernel interfaces of the seccomp filter, memory over several processes,
and the report of what is enforced.

A program's tests run batched in one sandbox (``run_python_tests``) give what one run each gives;
a program that misbehaves on one input fails that test alone, and one that attacks the tests
driver (kills it, tries its fds, memory or ptrace) fails its own tests and forges nothing.
Several programs in one sandbox (``run_python_programs``) give what a sandbox each gives: what a
program leaves (files, System V IPC, a changed input, a dead driver) never reaches the next one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from astraflow.sandbox import (
    BACKENDS,
    BwrapSandbox,
    RunResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxUnavailableError,
    base,
    open_sandbox,
    probe,
)
from astraflow.sandbox.host import Gate
from tests.unit.sandboxes import LIMITS, processes_with, working

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return working(request.param)


def test_runs_a_program_with_stdin_in_its_own_directory(sandbox: Sandbox) -> None:
    result = sandbox.run_python(
        "import os\nprint(os.getcwd(), input())\nopen('scratch', 'w').write('x')", stdin="hello\n"
    )
    assert result.ok and result.stdout == "/work hello\n" and result.describe() == "exit 0"


def test_network_is_unreachable(sandbox: Sandbox) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        # The outside address is tried with a UDP connect, which only looks up a route and sends
        # nothing: no packet leaves the machine even if the sandbox were broken.
        program = (
            "import socket\n"
            "print('interfaces', sorted(name for _, name in socket.if_nameindex()))\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "    print('connected host')\n"
            "except OSError as exc:\n"
            "    print('blocked host', exc.errno)\n"
            "try:\n"
            "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(('192.0.2.1', 9))\n"
            "    print('routed outside')\n"
            "except OSError as exc:\n"
            "    print('blocked outside', exc.errno)\n"
        )
        result = sandbox.run_python(program)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the host's server
    lines = result.stdout.splitlines()
    assert result.ok and lines[0] == "interfaces ['lo']", lines
    assert lines[1].startswith("blocked host") and lines[2].startswith("blocked outside"), lines


@pytest.mark.parametrize("target", ["/usr/escape", "/escape", "/etc/escape", "HOST"])
def test_writing_outside_the_throwaway_dir_fails(sandbox: Sandbox, tmp_path: Path, target: str) -> None:
    host_file = tmp_path / "escape.txt"
    path = str(host_file) if target == "HOST" else target
    result = sandbox.run_python(f"open({path!r}, 'w').write('pwned')")
    assert result.exit_code == 1 and (
        "Read-only file system" in result.stderr or "No such file or directory" in result.stderr
    )
    assert not host_file.exists() and not Path(target).exists()


@pytest.mark.parametrize("which", ["/etc/shadow", "/etc/passwd", "/root", "/home", "REPO", "SECRET"])
def test_host_files_are_not_visible(sandbox: Sandbox, tmp_path: Path, which: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret")
    secret.chmod(0o644)
    path = {"SECRET": str(secret), "REPO": str(REPO / "pyproject.toml")}.get(which, which)
    result = sandbox.run_python(
        f"import os\nprint(os.listdir({path!r}) if os.path.isdir({path!r}) else open({path!r}).read())"
    )
    assert result.exit_code == 1 and "FileNotFoundError" in result.stderr and "the-secret" not in result.stdout


def test_processes_are_capped(sandbox: Sandbox) -> None:
    program = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(5)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(n)"
    )
    result = sandbox.run_python(program)
    assert result.stdout.strip() and int(result.stdout) < LIMITS.max_processes


@pytest.mark.parametrize(
    ("name", "program", "timed_out"),
    [
        # it runs into the wall limit, or a limit kills its first process sooner (the memory cgroup's OOM
        # killer, seen under a loaded CI run): either way it fails, in time, and leaves nothing behind
        ("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", None),
        ("sleeping children", "import os, time\nfor _ in range(2):\n    os.fork()\ntime.sleep(60)", True),
        (
            "orphans left behind",
            "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        time.sleep(60)",
            False,
        ),
    ],
)
def test_runaway_processes_are_killed_with_the_sandbox(
    sandbox: Sandbox, name: str, program: str, timed_out: bool | None
) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    result = sandbox.run([sandbox.python, "-I", "main.py", marker], {"main.py": program})
    if timed_out is None:
        assert result.timed_out or result.exit_code != 0, result
    else:
        assert result.timed_out == timed_out and ("timed out" in result.describe()) == timed_out
    assert result.wall_ms < LIMITS.wall_seconds * 1000 + 2000
    deadline = time.monotonic() + 5.0  # the pid namespace is torn down asynchronously
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == [], f"{name}: processes outlived the sandbox"


def test_an_infinite_loop_hits_the_cpu_limit(sandbox: Sandbox) -> None:
    result = sandbox.run_python("while True:\n    pass")
    assert not result.ok and (result.describe() == "killed by SIGXCPU" or result.timed_out)
    assert result.wall_ms < LIMITS.wall_seconds * 1000 + 2000


def test_memory_and_output_are_bounded(sandbox: Sandbox) -> None:
    hog = sandbox.run_python("x = bytearray(1024 ** 3)")
    assert hog.exit_code == 1 and "MemoryError" in hog.stderr
    flood = sandbox.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 4096)")
    assert not flood.ok and len(flood.stdout) <= LIMITS.max_output_bytes and flood.truncated


def test_a_program_that_cannot_start_is_a_sandbox_error(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError, match="exec-failed"):
        sandbox.run(["/usr/bin/no-such-interpreter", "main.py"], {"main.py": ""})
    with pytest.raises(SandboxError, match="plain names"):
        sandbox.run([sandbox.python, "main.py"], {"../main.py": ""})


def test_a_broken_sandbox_is_an_error_not_a_result(sandbox: Sandbox) -> None:
    broken = type(sandbox)(LIMITS, python="/nonexistent/python3")
    with pytest.raises(SandboxError, match="did not run"):
        broken.run_python("print(1)")


def test_no_working_backend_is_refused_with_a_hint() -> None:
    assert "cannot start" in (probe(BwrapSandbox(LIMITS, binary="/nonexistent/bwrap")) or "")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        open_sandbox("auto", LIMITS, python="/nonexistent/python3")
    with pytest.raises(SandboxUnavailableError, match="unknown"):
        open_sandbox("docker", LIMITS)


def test_open_sandbox_auto_prefers_a_working_backend() -> None:
    if all(probe(cls(LIMITS)) for cls in BACKENDS.values()):
        pytest.skip("no sandbox backend works here")
    assert open_sandbox("auto", LIMITS).run_python("print(6 * 7)").stdout == "42\n"


BATCH_INPUTS = ["1\n", "0\n", "2\n"]  # the programs below misbehave on "0" alone


def _fields(result: RunResult) -> tuple:
    return result.exit_code, result.stdout, result.stderr, result.timed_out, result.truncated


@pytest.mark.parametrize(
    ("name", "program"),
    [
        ("stdin", "n = int(input())\nprint(n * 3 + 1)"),
        ("stdin as files", "import sys\nprint(repr(open('/dev/stdin').read()), repr(sys.stdin.read()))"),
        ("exit status", "import sys\nsys.exit(int(input()) or 'bye')"),
        ("traceback", "n = int(input())\nprint(n)\nprint(10 // n)"),
        ("syntax error", "print("),
        (
            "main module, threads, atexit",
            "import atexit, sys, threading\n"
            "print(__name__, __file__, sys.argv)\n"
            "atexit.register(print, 'atexit')\n"
            "threading.Thread(target=lambda: print('thread', input())).start()",
        ),
        ("stderr", "import sys\nsys.stderr.write('err\\n')\nprint(input(), end='')"),
        ("stdout closed", "import os\nos.close(1)\nprint(input())"),
        ("killed by a signal", "import os\nif input() == '0':\n    os.kill(os.getpid(), 9)"),
    ],
)
def test_batched_tests_give_what_one_run_each_gives(sandbox: Sandbox, name: str, program: str) -> None:
    batched = sandbox.run_python_tests(program, BATCH_INPUTS)
    assert [_fields(r) for r in batched] == [_fields(sandbox.run_python(program, stdin)) for stdin in BATCH_INPUTS], (
        name
    )


@pytest.mark.parametrize(
    ("name", "program", "failed"),
    [
        (
            "infinite loop",
            "n = int(input())\nwhile n == 0:\n    pass\nprint(n)",
            lambda r: r.describe() == "killed by SIGXCPU" or r.timed_out,
        ),
        (
            "sleep",
            "import time\nn = int(input())\nif n == 0:\n    time.sleep(60)\nprint(n)",
            lambda r: r.timed_out and r.wall_ms < LIMITS.wall_seconds * 1000 + 1000,
        ),
        (
            "crash",
            "n = int(input())\nprint(n // n * n)",
            lambda r: r.exit_code == 1 and "ZeroDivisionError" in r.stderr,
        ),
        (
            "fork bomb",
            "import os\n"
            "n = int(input())\n"
            "while n == 0:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n"
            "print(n)",
            lambda r: r.timed_out,
        ),
        (
            "output over the cap",
            "n = int(input())\nprint('x' * 10000 if n == 0 else n)",
            lambda r: r.ok and r.truncated and r.stdout == "x" * LIMITS.max_output_bytes,
        ),
        (
            "output flood",
            "import sys\nn = int(input())\nwhile n == 0:\n    sys.stdout.write('x' * 4096)\nprint(n)",
            lambda r: not r.ok and r.truncated,
        ),
    ],
)
def test_a_failure_stays_in_its_own_test(sandbox: Sandbox, name: str, program: str, failed) -> None:
    first, broken, last = sandbox.run_python_tests(program, BATCH_INPUTS)
    assert failed(broken), f"{name}: {broken}"
    assert [_fields(first), _fields(last)] == [(0, "1\n", "", False, False), (0, "2\n", "", False, False)], name


def test_processes_a_test_leaves_are_gone_before_the_next(sandbox: Sandbox) -> None:
    program = (
        "import os, time\n"
        "if input() == '0':\n"
        "    for _ in range(3):\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            time.sleep(60)\n"
        "print(sum(p.isdigit() for p in os.listdir('/proc')))"
    )
    first, leaving, last = (int(r.stdout) for r in sandbox.run_python_tests(program, BATCH_INPUTS))
    assert leaving == first + 3 and last == first


@pytest.mark.parametrize("attack", ["os.kill(os.getppid(), signal.SIGKILL)", "os.kill(os.getppid(), signal.SIGTERM)"])
def test_a_program_that_kills_the_driver_fails_every_test(sandbox: Sandbox, attack: str) -> None:
    results = sandbox.run_python_tests(f"import os, signal\nprint(input())\n{attack}", BATCH_INPUTS)
    assert len(results) == 3 and not any(r.ok for r in results)
    assert all("the tests driver reported no results" in r.stderr for r in results)


def test_a_program_cannot_forge_the_report(sandbox: Sandbox) -> None:
    forged = (
        '{"results": ['
        + ", ".join(
            [
                '{"exit_code": 0, "stdout": "Rk9SR0VECg==", "stderr": "", '
                '"timed_out": false, "wall_ms": 1, "truncated": false}'
            ]
            * 3
        )
        + "]}"
    )
    program = (
        "import ctypes, os\n"
        "targets = {'driver stdout': f'/proc/{os.getppid()}/fd/1', 'driver memory': f'/proc/{os.getppid()}/mem', "
        "'init stdout': '/proc/1/fd/1'}\n"
        "for name, path in targets.items():\n"
        "    try:\n"
        f"        open(path, 'w').write({forged!r})\n"
        "        print('wrote', name)\n"
        "    except OSError:\n"
        "        print('denied', name)\n"
        "print('ptrace', ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0))\n"  # PTRACE_ATTACH
    )
    results = sandbox.run_python_tests(program, BATCH_INPUTS)
    assert all("FORGED" not in r.stdout for r in results)  # base64 of the forged stdout
    lines = results[0].stdout.splitlines()
    assert {"denied driver stdout", "denied driver memory", "ptrace -1"} <= set(lines), lines


def test_batched_escape_attempts_are_contained(sandbox: Sandbox) -> None:
    attempts = {
        "write": "open('/usr/escape', 'w')",
        "read": "open('/etc/shadow').read()",
        "connect": "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(('192.0.2.1', 9))",
        "memory": "bytearray(1024 ** 3)",
    }
    program = (
        "try:\n"
        f"    exec({attempts!r}[input()])\n"
        "    print('escaped')\n"
        "except (OSError, MemoryError) as exc:\n"
        "    print(type(exc).__name__)"
    )
    results = sandbox.run_python_tests(program, list(attempts))
    assert [r.stdout for r in results] == ["OSError\n", "FileNotFoundError\n", "OSError\n", "MemoryError\n"]
    assert not Path("/usr/escape").exists()


LEAVER = (
    "import ctypes, os\n"
    "for path in ('/tmp/left', '/work/left', '/dev/shm/left'):\n"
    "    try:\n"
    "        open(path, 'w').write('x')\n"
    "    except OSError:\n"
    "        pass\n"
    "if not os.path.exists('/tmp/locked'):\n"
    "    os.makedirs('/tmp/locked/deep')\n"
    "    os.chmod('/tmp/locked', 0)\n"
    "libc = ctypes.CDLL(None)\n"
    "libc.shmget(0x5EED, 4096, 0o1666)\n"  # IPC_CREAT | 0666
    "libc.msgget(0x5EED, 0o1666)\n"
    "print(input())\n"
)
LOOKER = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None)\n"
    "print(sorted(os.listdir('/tmp')), sorted(os.listdir('/work')), "
    "os.path.isdir('/dev/shm') and sorted(os.listdir('/dev/shm')), "
    "libc.shmget(0x5EED, 4096, 0o666), libc.msgget(0x5EED, 0o666), input())\n"
)


RLIMITS = (
    "import resource as r\nprint([r.getrlimit(getattr(r, f'RLIMIT_{n}')) for n in ('CPU', 'AS', 'FSIZE', 'NOFILE')])"
)


def test_programs_in_one_sandbox_give_what_a_sandbox_each_gives(sandbox: Sandbox) -> None:
    programs = [
        ("print(int(input()) * 3 + 1)", BATCH_INPUTS),
        (LEAVER, BATCH_INPUTS),
        (LOOKER, ["a", "b"]),
        ("import sys\nsys.exit(int(input()) or 'bye')", BATCH_INPUTS),
        ("print(input())", []),
        (LOOKER, ["c"]),
        (RLIMITS, ["d"]),  # RLIMIT_NPROC aside: the driver is one of the sandbox's processes, so it gets one more
    ]
    together = sandbox.run_python_programs(programs)
    alone = [[sandbox.run_python(source, stdin) for stdin in stdins] for source, stdins in programs]
    assert [[_fields(r) for r in results] for results in together] == [
        [_fields(r) for r in results] for results in alone
    ]
    looked = together[2][0].stdout
    assert looked.startswith("[] ['main.py'] ") and looked.endswith(" -1 -1 a\n"), looked  # nothing left over
    assert sandbox.run_python_programs([]) == []


def _counting_runs(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> list:
    runs = []
    monkeypatch.setattr(
        type(sandbox), "_run", lambda self, *args, **kwargs: runs.append(args) or Sandbox._run(self, *args, **kwargs)
    )
    return runs


SIBLINGS = [("print(input())", ["0"]), None, ("print(input())", ["2"]), ("print(input())", ["3"])]


@pytest.mark.parametrize("attack", ["SIGKILL", "SIGTERM"])
def test_a_program_that_kills_the_driver_fails_only_its_own_tests(
    sandbox: Sandbox, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its report is lost with the driver; the programs after it run again in a fresh sandbox."""
    runs = _counting_runs(sandbox, monkeypatch)
    attacker = (f"import os, signal\nprint(input())\nos.kill(os.getppid(), signal.{attack})", BATCH_INPUTS)
    before, killed, *after = sandbox.run_python_programs([attacker if p is None else p for p in SIBLINGS])
    assert [r.stdout for results in (before, *after) for r in results] == ["0\n", "2\n", "3\n"]
    assert not any(r.ok for r in killed) and "reported no results" in killed[0].stderr
    assert len(runs) == 2


def test_programs_after_one_the_driver_cannot_clean_up_after_run_in_a_fresh_sandbox(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver stops after the report of a program whose leftovers it could not remove (here: a
    driver that never can), and the host runs the rest again, each in a sandbox of its own."""
    driver = tmp_path / "tests_driver.py"
    driver.write_text(base.TESTS_DRIVER.read_text().replace("clean = clean_up()", "clean = not clean_up()"))
    monkeypatch.setattr(base, "TESTS_DRIVER", driver)
    runs = _counting_runs(sandbox, monkeypatch)
    results = sandbox.run_python_programs([("print(input())", BATCH_INPUTS) if p is None else p for p in SIBLINGS])
    assert [[r.stdout for r in program] for program in results] == [["0\n"], BATCH_INPUTS, ["2\n"], ["3\n"]]
    assert len(runs) == 4


def test_tests_are_split_over_runs_when_the_report_would_not_fit(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = type(sandbox)(
        SandboxLimits(wall_seconds=2.0, max_file_mb=1, max_output_bytes=200_000)
    )  # one report per 1 MiB file
    runs = []
    monkeypatch.setattr(
        type(box), "_run", lambda self, *args, **kwargs: runs.append(args) or Sandbox._run(self, *args, **kwargs)
    )
    assert [r.stdout for r in box.run_python_tests("print(input())", ["a", "b", "c"])] == ["a\n", "b\n", "c\n"]
    assert len(runs) == 3 and box.run_python_tests("print(1)", []) == []


def test_a_driver_that_never_starts_is_a_sandbox_error(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = type(sandbox)(LIMITS, python="/nonexistent/python3")
    with pytest.raises(SandboxError, match="did not run"):
        broken.run_python_tests("print(1)", ["1"])
    silent = tmp_path / "tests_driver.py"
    silent.write_text("raise SystemExit(3)")
    monkeypatch.setattr(base, "TESTS_DRIVER", silent)
    with pytest.raises(SandboxError, match="driver-ready"):
        sandbox.run_python_tests("print(1)", ["1"])


def test_a_launcher_gone_before_its_gate_opens_is_not_an_error_of_the_host() -> None:
    """A launcher that dies after its move into the cgroup (its python cannot start) closes the gate's
    last reader: the write meets EPIPE, and the run must end as "did not run", not as a host error.
    The cgroup here kills the launcher inside ``enter``, which forces that order every time."""
    gate = Gate()
    process = subprocess.Popen([sys.executable, "-c", LAUNCHER_THAT_FORKS, str(gate.read_fd)], pass_fds=(gate.read_fd,))

    class KillingCgroup:
        def enter(self, pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
                time.sleep(0.001)  # the pipe's last reader is closed once the child is a zombie

    try:
        gate.open_for(process, KillingCgroup(), timeout=30)
    finally:
        process.kill()
        process.wait()
    assert gate.write_fd == -1 and gate.read_fd == -1


# The backend's stand-in: it forks the "launcher" (which keeps the gate's read end), closes its own
# copy, and waits; the parent's copy closes in Gate.open_for.
LAUNCHER_THAT_FORKS = """
import os, sys, time
fd = int(sys.argv[1])
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
os.close(fd)
time.sleep(60)
"""
