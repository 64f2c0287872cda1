"""The seccomp filter of the sandbox: a deny-list of kernel interfaces a program has no use for.

Why a filter at all: the sandbox's user namespace makes the program root *inside* it, and with
that the kernel opens interfaces it otherwise keeps for root (a nested user namespace gives back
every capability the launcher dropped; mounts, keyrings, BPF, io_uring, perf and userfaultfd are
where kernel exploits usually start). Namespaces and rlimits do not close those doors; seccomp
does, for every process in the sandbox, and nothing the program does can lift it.

Why a deny-list, not Docker's allow-list: the programs are plain Python (and what it starts), so
the list of what they must never call is short and stable, while an allow-list has to follow
every libc and interpreter release. The list follows Docker's default profile, in its spirit:

- new namespaces: ``unshare`` and ``setns`` always; ``clone`` with any ``CLONE_NEW*`` flag;
  ``clone3`` gets ``ENOSYS`` (its flags are in memory a filter cannot read), so glibc falls back
  to ``clone``, as it does under Docker;
- other processes: ``ptrace``, ``process_vm_readv`` / ``writev``, ``process_madvise``, ``kcmp``,
  ``pidfd_getfd``, ``migrate_pages``, ``move_pages``;
- kernel attack surface: ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, the
  keyring (``add_key``, ``request_key``, ``keyctl``), ``modify_ldt``;
- mounts: ``mount``, ``umount2``, ``pivot_root``, the new mount API (``fsopen`` ...
  ``mount_setattr``), ``open_by_handle_at``;
- the machine itself: modules, ``kexec_*``, ``reboot``, ``swapon`` / ``swapoff``, ``syslog``,
  ``acct``, ``quotactl*``, ``lookup_dcookie``, ``uselib``, ``vhangup``, ``iopl`` / ``ioperm``;
- ``personality`` only with the values Docker allows (no ``ADDR_NO_RANDOMIZE``,
  ``READ_IMPLIES_EXEC``).

Denied calls fail with ``EPERM``, so a program sees an ordinary error. A syscall of another ABI
(i386 through ``int 0x80``, arm32 compat) kills the process, since the numbers above mean nothing
there; an x32 syscall on x86_64 gets ``ENOSYS``. The filter exists for x86_64 and aarch64 (the
tables below; a test checks them against the kernel headers); elsewhere ``deny_filter`` returns
``None`` and the sandbox reports seccomp as off.

The program is classic BPF, built here from ``struct sock_filter`` records (no libseccomp), and
installed by the launcher inside the sandbox (``launcher.py``) after its own setup.
"""

from __future__ import annotations

import errno
import struct
import sys

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h.
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "clone": 56,
        "clone3": 435,
        "personality": 135,
        "unshare": 272,
        "setns": 308,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "process_madvise": 440,
        "kcmp": 312,
        "pidfd_getfd": 438,
        "migrate_pages": 256,
        "move_pages": 279,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "modify_ldt": 154,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "open_by_handle_at": 304,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "reboot": 169,
        "swapon": 167,
        "swapoff": 168,
        "syslog": 103,
        "acct": 163,
        "quotactl": 179,
        "quotactl_fd": 443,
        "lookup_dcookie": 212,
        "uselib": 134,
        "vhangup": 153,
        "iopl": 172,
        "ioperm": 173,
    },
    "aarch64": {
        "clone": 220,
        "clone3": 435,
        "personality": 92,
        "unshare": 97,
        "setns": 268,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "process_madvise": 440,
        "kcmp": 272,
        "pidfd_getfd": 438,
        "migrate_pages": 238,
        "move_pages": 239,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "open_by_handle_at": 265,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "reboot": 142,
        "swapon": 224,
        "swapoff": 225,
        "syslog": 116,
        "acct": 89,
        "quotactl": 60,
        "quotactl_fd": 443,
        "lookup_dcookie": 18,
        "vhangup": 58,
    },
}
SPECIAL = ("clone", "clone3", "personality")  # handled by their own rules below
CLONE_NEW_ANY = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Linux, Linux32, UNAME26 of both, query

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
LD_ABS, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
NR, ARCH, ARGS = 0, 4, 16  # offsets in struct seccomp_data


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _arg0_low() -> bytes:
    """Load the low 32 bits of the first argument (the flags of ``clone``, ``personality``)."""
    return _op(LD_ABS, ARGS + (0 if sys.byteorder == "little" else 4))


def deny_filter(machine: str) -> bytes | None:
    """The BPF program (``struct sock_filter`` records) for ``machine``, or ``None`` where none exists."""
    if machine not in SYSCALLS:
        return None
    table = SYSCALLS[machine]
    eperm = _op(RET, RET_ERRNO | errno.EPERM)
    program = [_op(LD_ABS, ARCH), _op(JEQ, AUDIT_ARCH[machine], jt=1), _op(RET, RET_KILL_PROCESS), _op(LD_ABS, NR)]
    if machine == "x86_64":
        program += [_op(JSET, X32_SYSCALL_BIT, jf=1), _op(RET, RET_ERRNO | errno.ENOSYS)]
    for name, number in table.items():
        if name not in SPECIAL:
            program += [_op(JEQ, number, jf=1), eperm]
    program += [_op(JEQ, table["clone3"], jf=1), _op(RET, RET_ERRNO | errno.ENOSYS)]
    # clone: the accumulator is reloaded with the flags, so the rule ends in its own verdict.
    program += [_op(JEQ, table["clone"], jf=4), _arg0_low(), _op(JSET, CLONE_NEW_ANY, jf=1), eperm, _op(RET, RET_ALLOW)]
    allowed = len(PERSONALITIES)
    program += [_op(JEQ, table["personality"], jf=allowed + 2), _arg0_low()]
    program += [_op(JEQ, value, jt=allowed - i) for i, value in enumerate(PERSONALITIES)]
    program += [eperm, _op(RET, RET_ALLOW)]
    return b"".join(program)


def denied_names(machine: str) -> list[str]:
    """The syscalls the filter of ``machine`` refuses outright or in part (for reports and tests)."""
    return sorted(SYSCALLS.get(machine, {}))
