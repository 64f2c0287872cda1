"""The sandbox's second line: what keeps a program from the host's secrets and the kernel's root-only doors.

Each escape attempt runs on every backend (``sandboxes.working``: a backend that does not work
fails under ``CI=true``, never skips) and would succeed without the protection it names:

- the host's environment: a secret in the test's environment is nowhere in the sandbox
  (``host.HOST_ENV``, ``--clearenv``, the launcher's own environment for the program);
- nested user namespaces (``unshare -U``, ``unshare(2)``, ``clone(CLONE_NEWUSER)``, ``clone3``):
  the seccomp filter, and bubblewrap's ``--disable-userns``;
- ptrace, ``process_vm_readv`` and the other kernel interfaces of the seccomp filter: ``EPERM``
  where the kernel itself would answer otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import uuid
from pathlib import Path

import pytest

from astraflow.sandbox import BACKENDS, Sandbox, seccomp
from tests.unit.sandboxes import working

MACHINE = os.uname().machine


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return working(request.param)


def _json(sandbox: Sandbox, program: str) -> dict:
    result = sandbox.run_python(program)
    assert result.ok, result.stderr
    return json.loads(result.stdout)


def test_the_hosts_environment_is_not_visible(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("ASTRAFLOW_TEST_SECRET", secret)
    program = (
        "import json, os\n"
        "seen = {'environ': dict(os.environ)}\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        seen[pid] = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace')\n"
        "    except OSError as exc:\n"
        "        seen[pid] = exc.strerror\n"
        "print(json.dumps(seen))"
    )
    seen = _json(sandbox, program)
    assert secret not in json.dumps(seen) and "ASTRAFLOW_TEST_SECRET" not in json.dumps(seen)
    assert set(seen["environ"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}


NESTED_USERNS = {
    "unshare -U": "import subprocess\nr = subprocess.run(['unshare', '-U', 'true'], capture_output=True)\n"
    "print(r.returncode, r.stderr.decode().strip())",
    "unshare(2)": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "print(libc.unshare(0x10000000), ctypes.get_errno())",
    "clone(CLONE_NEWUSER)": "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "pid = libc.syscall({clone}, 0x10000000 | 17, 0, 0, 0, 0)\n"
    "if pid == 0:\n    os._exit(0)\n"
    "print(pid, ctypes.get_errno())\n"
    "if pid > 0:\n    os.waitpid(pid, 0)",
    "clone3(CLONE_NEWUSER)": "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "args = ctypes.create_string_buffer(struct.pack('=11Q', 0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0), 88)\n"
    "pid = libc.syscall(435, args, 88)\n"
    "if pid == 0:\n    libc._exit(0)\n"
    "print(pid, ctypes.get_errno())",
}


@pytest.mark.parametrize("how", sorted(NESTED_USERNS))
def test_nested_user_namespaces_are_refused(sandbox: Sandbox, how: str) -> None:
    program = NESTED_USERNS[how].format(clone=seccomp.SYSCALLS[MACHINE]["clone"])
    result = sandbox.run_python(program)
    assert result.ok, result.stderr
    code, _, why = result.stdout.strip().partition(" ")
    assert code in ("-1", "1"), f"{how} made a user namespace: {result.stdout}"
    assert why, result.stdout


def test_user_namespaces_are_refused_by_each_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Either guard alone holds: the filter without ``--disable-userns``, and ``--disable-userns`` without it."""
    program = NESTED_USERNS["unshare(2)"]
    no_disable = working("bwrap")
    monkeypatch.setattr(no_disable, "disable_userns", False)
    assert no_disable.run_python(program).stdout.split() == ["-1", str(errno.EPERM)]
    box = working("bwrap")
    if not box.disable_userns:
        pytest.skip("this bubblewrap has no --disable-userns (0.8 or later has)")
    monkeypatch.setattr(box, "seccomp", None)
    assert box.run_python(program).stdout.split() == ["-1", str(errno.ENOSPC)]


def test_ptrace_and_reading_another_process_are_refused(sandbox: Sandbox) -> None:
    program = (
        "import ctypes, json, os, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(*args):\n"
        "    r = libc.syscall(*args)\n"
        "    return [r, ctypes.get_errno() if r == -1 else 0]\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(5)\n"
        "    os._exit(0)\n"
        "secret = ctypes.create_string_buffer(b'x' * 64)\n"
        "local = (ctypes.c_void_p * 2)(ctypes.addressof(ctypes.create_string_buffer(64)), 64)\n"
        "remote = (ctypes.c_void_p * 2)(ctypes.addressof(secret), 64)\n"
        f"nr = {seccomp.SYSCALLS[MACHINE]!r}\n"
        "seen = {\n"
        "    'traceme': call(nr['ptrace'], 0, 0, 0, 0),\n"
        "    'attach': call(nr['ptrace'], 16, child, 0, 0),\n"
        "    'process_vm_readv': call(nr['process_vm_readv'], child, local, 1, remote, 1, 0),\n"
        "}\n"
        "os.kill(child, 9)\n"
        "print(json.dumps(seen))"
    )
    seen = _json(sandbox, program)
    assert seen == {name: [-1, errno.EPERM] for name in seen}, seen


ROOT_ONLY = ["keyctl", "add_key", "bpf", "perf_event_open", "io_uring_setup", "kcmp", "pidfd_getfd", "mount", "setns"]


def test_kernel_interfaces_kept_for_root_answer_eperm(sandbox: Sandbox) -> None:
    """Called with zero arguments the kernel would say EFAULT, EINVAL, ENOKEY...: the filter says EPERM first."""
    numbers = {name: seccomp.SYSCALLS[MACHINE][name] for name in ROOT_ONLY}
    program = (
        "import ctypes, json\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "seen = {}\n"
        f"for name, nr in {numbers!r}.items():\n"
        "    seen[name] = [libc.syscall(nr, 0, 0, 0, 0, 0), ctypes.get_errno()]\n"
        f"seen['personality'] = [libc.syscall({seccomp.SYSCALLS[MACHINE]['personality']}, 0x0040000), "
        "ctypes.get_errno()]\n"
        "print(json.dumps(seen))"
    )
    seen = _json(sandbox, program)
    assert seen == {name: [-1, errno.EPERM] for name in [*ROOT_ONLY, "personality"]}, seen


def test_threads_and_subprocesses_still_work_under_the_filter(sandbox: Sandbox) -> None:
    """glibc makes threads with clone3, which the filter answers ENOSYS: it must fall back to clone."""
    program = (
        "import subprocess, threading\n"
        "out = []\n"
        "t = threading.Thread(target=out.append, args=('thread',))\n"
        "t.start(); t.join()\n"
        "out.append(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())\n"
        "print(*out)"
    )
    result = sandbox.run_python(program)
    assert result.ok and result.stdout == "thread child\n", result.stderr


HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_the_filters_syscall_numbers_are_the_kernels(machine: str) -> None:
    if not HEADERS[machine].exists():
        pytest.skip(f"no kernel headers at {HEADERS[machine]} (linux-libc-dev)")
    defined = dict(re.findall(r"#define __NR_(\w+)\s+(\d+)", HEADERS[machine].read_text()))
    assert {name: int(defined[name]) for name in seccomp.SYSCALLS[machine]} == seccomp.SYSCALLS[machine]


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_every_jump_of_the_filter_lands_inside_it(machine: str) -> None:
    program = seccomp.deny_filter(machine) or b""
    ops = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert 0 < len(ops) <= 4096 and ops[-1][0] == seccomp.RET
    for index, (code, jt, jf, _) in enumerate(ops):
        if code in (seccomp.JEQ, seccomp.JSET):
            assert index + 1 + max(jt, jf) < len(ops), index
    assert seccomp.deny_filter("riscv64") is None
