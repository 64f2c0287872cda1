"""The sandbox's second line: what keeps a program from the host's secrets and the kernel's root-only doors.

Each escape attempt runs on every backend (``sandboxes.working``: a backend that does not work
fails under ``CI=true``, never skips) and would succeed without the protection it names:

- the host's environment: a secret in the test's environment is nowhere in the sandbox
  (``host.HOST_ENV``, ``--clearenv``, the launcher's own environment for the program);
- nested user namespaces (``unshare -U``, ``unshare(2)``, ``clone(CLONE_NEWUSER)``, ``clone3``):
  the seccomp filter, and bubblewrap's ``--disable-userns``;
- ptrace, ``process_vm_readv`` and the other kernel interfaces of the seccomp filter: ``EPERM``
  where the kernel itself would answer otherwise;
- memory over several processes: bounded by the run's cgroup where the host has one;
- the report (``Sandbox.enforcement()``) holds the essentials and matches what the kernel
  enforces on the running program (its cgroup and the limits written there).
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from astraflow.sandbox import BACKENDS, Sandbox, cgroups, seccomp
from astraflow.sandbox.bwrap import BwrapSandbox
from tests.unit.sandboxes import LIMITS, processes_with, working

MACHINE = os.uname().machine
MIB = 1024 * 1024


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


def test_memory_over_several_processes_is_bounded(sandbox: Sandbox) -> None:
    """Four processes of 100 MiB each stay under RLIMIT_AS one by one; the run's cgroup stops them together."""
    program = (
        "import os, time\n"
        "children = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        open('/proc/self/oom_score_adj', 'w').write('1000')  # the OOM killer takes these, not the parent\n"
        "        block = b'x' * (100 << 20)\n"
        "        time.sleep(0.5)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "print(sum(os.waitpid(pid, 0)[1] == 0 for pid in children))"
    )
    box = type(sandbox)(replace(LIMITS, wall_seconds=10.0))  # reclaim before the OOM kills takes a while
    result = box.run_python(program)
    assert result.ok, result
    held = int(result.stdout) * 100 * MIB
    if "memory" in (sandbox.cgroups.controllers if sandbox.cgroups else ()):
        assert held <= cgroups.memory_bytes(LIMITS), f"{result.stdout} processes held 100 MiB: {box.enforcement()}"
    else:
        assert held <= LIMITS.max_processes * LIMITS.memory_mb * MIB  # rlimits alone: per process


def _cgroup_of(pid: int) -> dict[str, str]:
    return cgroups.parse_own(Path(f"/proc/{pid}/cgroup").read_text())


def _program_with(marker: str) -> int | None:
    """The host pid of the program whose last argument is ``marker`` (not the launcher or bwrap naming it)."""
    for pid in processes_with(marker):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").rsplit(b"\0", 1)[-1] == marker.encode():
                return pid
        except OSError:
            continue
    return None


def test_the_report_holds_the_essentials_and_matches_the_kernel(sandbox: Sandbox) -> None:
    report = sandbox.enforcement()
    assert report.missing() == [], report.describe()
    assert report.network_isolated and report.seccomp == (MACHINE in seccomp.SYSCALLS)
    assert ("seccomp" in report.userns_forbidden) == report.seccomp
    if isinstance(sandbox, BwrapSandbox):
        assert ("bwrap --disable-userns" in report.userns_forbidden) == sandbox.disable_userns
    assert any("RLIMIT_AS" in entry for entry in report.memory)
    setup = sandbox.cgroups
    assert report.cgroup == (setup.version if setup else None)
    assert any("cgroup" in entry for entry in report.memory) == bool(setup and "memory" in setup.controllers)
    # The running program's cgroups, read on the host: the run's own, holding the reported limits.
    marker = f"marker-{uuid.uuid4().hex}"
    argv = [sandbox.python, "-I", "-c", "import time; time.sleep(1.5)", marker]
    run = threading.Thread(target=sandbox.run, args=(argv,))
    run.start()
    deadline = time.monotonic() + 5.0
    while (pid := _program_with(marker)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pid is not None
    placed, written, expected = _cgroup_of(pid), {}, {}
    for hierarchy in setup.hierarchies if setup else ():
        run_dir = hierarchy.parent / placed["" if setup.version == "v2" else hierarchy.controllers[0]].rsplit("/")[-1]
        assert run_dir.name.startswith(cgroups.PREFIX), placed
        for controller in hierarchy.controllers:
            for file, value in setup.settings(LIMITS)[controller].items():
                if (run_dir / file).exists():
                    written[file], expected[file] = (run_dir / file).read_text().strip(), value
    run.join()
    if setup is None:
        assert placed == _cgroup_of(os.getpid()), "no per-run cgroup is reported, yet the program is in one"
        return
    assert written == expected and {"pids.max"} <= set(written), written
    assert not [p for h in setup.hierarchies for p in h.parent.glob(f"{cgroups.PREFIX}{os.getpid()}-*")], "left over"


HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_OWN = "8:pids:/\n4:memory:/jobs/abc\n1:cpu:/\n0::/\n"
V2_MOUNTS = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
V2_OWN = "0::/system.slice/worker.service\n"


def test_cgroup_mounts_and_own_paths_are_read_from_proc() -> None:
    mounts = cgroups.parse_mounts(HYBRID_MOUNTS)
    assert [(fstype, str(point)) for fstype, point, _, _ in mounts] == [
        ("cgroup", "/sys/fs/cgroup/cpu"),
        ("cgroup", "/sys/fs/cgroup/memory"),
        ("cgroup", "/sys/fs/cgroup/pids"),
        ("cgroup2", "/sys/fs/cgroup/unified"),
    ]
    assert cgroups.parse_own(HYBRID_OWN) == {"pids": "/", "memory": "/jobs/abc", "cpu": "/", "": "/"}
    assert cgroups.parse_own("2:cpu,cpuacct:/a\n") == {"cpu": "/a", "cpuacct": "/a"}


def test_cgroup_v2_candidates_go_from_the_delegated_to_the_top() -> None:
    parents = [str(s.hierarchies[0].parent) for s in cgroups.candidates(V2_MOUNTS, V2_OWN, "/srv/delegated")]
    assert parents == ["/srv/delegated", "/sys/fs/cgroup/system.slice/worker.service", "/sys/fs/cgroup"]
    assert cgroups.candidates(V2_MOUNTS, V2_OWN, "none") == []


def test_cgroup_limits_follow_the_sandbox_limits() -> None:
    memory = str((LIMITS.memory_mb + 2 * LIMITS.max_file_mb + cgroups.SLACK_MB) * MIB)
    v2 = cgroups.CgroupSetup("v2", ()).settings(LIMITS)
    assert v2 == {
        "memory": {"memory.max": memory, "memory.swap.max": "0"},
        "pids": {"pids.max": str(LIMITS.max_processes + 1)},
        "cpu": {"cpu.max": "100000 100000"},
    }
    v1 = cgroups.CgroupSetup("v1", ()).settings(replace(LIMITS, cpus=0.5))
    assert v1["memory"]["memory.limit_in_bytes"] == memory and v1["cpu"]["cpu.cfs_quota_us"] == "50000"


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
