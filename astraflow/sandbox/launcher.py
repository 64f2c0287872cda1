"""The launcher: runs *inside* the sandbox, sets the limits, then ``exec``s the program.

Executed as ``python3 -I -S -c <this file's source> <spec json>`` by the system interpreter, so it
imports nothing but the standard library and nothing from AstraFlow. Steps:

1. (``unshare`` backend only) build the filesystem bubblewrap would build: a tmpfs root with
   read-only binds of the system directories, a tmpfs ``/work`` holding copies of the input files,
   a tmpfs ``/tmp``, ``/proc`` of the new pid namespace and a few ``/dev`` nodes; ``pivot_root``
   into it and detach the host's root, drop every capability (bounding set included) and set
   ``no_new_privs``.
2. Install the seccomp filter of the spec (``seccomp.py`` builds it; hex of its ``sock_filter``
   records), with ``no_new_privs`` (bubblewrap sets it too): every process the program starts
   inherits it, and nothing can remove it. Here, not through ``bwrap --seccomp``, so both
   backends install it the same way, after the setup that needs ``mount`` and ``pivot_root``.
3. With ``gate_fd`` (the host makes a cgroup per run), wait until the host has put this process
   in the run's cgroup and says so on that pipe (``host.Gate`` says why here). Then fork, staying
   as the pid namespace's init (pid 1 of both backends: bubblewrap runs with ``--as-pid-1``) that
   reaps orphans and exits with the program's status (128 + N for signal N, as bubblewrap does).
4. Set the rlimits of the spec on this process (they are inherited by everything it starts).
5. Write ``ready`` to the status fd, mark it close-on-exec, and ``exec`` the program. An ``exec``
   that fails writes ``exec-failed: <reason>`` and exits 127: a sandbox error, not a result.
   With ``pass_status`` the program is the trusted tests driver instead: the fd stays open and
   its number is the driver's last argument (it writes its own line and closes the fd before it
   runs anything untrusted).
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 24, 38, 22, 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
LIBC = ctypes.CDLL(None, use_errno=True)


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None):
    check(
        LIBC.mount(
            source and source.encode(), target.encode(), fstype and fstype.encode(), flags, data and data.encode()
        ),
        f"mount {target}",
    )


def bind_read_only(source, target):
    """Bind ``source`` on ``target`` read-only, keeping the flags the kernel locked on it."""
    mount(source, target, None, MS_BIND | MS_REC)
    vfs = os.statvfs(source)
    locked = sum(
        flag
        for st, flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC))
        if vfs.f_flag & st
    )
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | locked)


def build_root(root, spec):
    """Step 1: the new root under ``root`` (a host directory used only as a mount point)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    for path in spec["ro_binds"]:
        os.makedirs(root + path)
        bind_read_only(path, root + path)
    for link, target in spec["symlinks"].items():
        os.symlink(target, root + link)
    for path, size in spec["tmpfs"].items():
        os.makedirs(root + path)
        mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")
    for target, source in spec["files"].items():
        with open(source, "rb") as src, open(root + target, "wb") as dst:
            dst.write(src.read())
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/dev")
    for node in ("null", "zero", "urandom", "random"):
        open(root + "/dev/" + node, "w").close()
        mount("/dev/" + node, root + "/dev/" + node, None, MS_BIND)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    check(LIBC.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    check(LIBC.umount2(b".", MNT_DETACH), "detach the host root")
    os.chdir(spec["cwd"])


def drop_capabilities():
    for cap in range(64):
        LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    check(LIBC.syscall(SYS_CAPSET[os.uname().machine], header, data), "capset")
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    """Step 2: the filter (``struct sock_filter`` records, 8 bytes each) on this process and its children."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def wait_for_cgroup(gate):
    """Step 3: block until the host writes to the gate; a gate closed unwritten is a failed setup."""
    placed = os.read(gate, 1)
    os.close(gate)
    if placed != b"1":
        raise OSError(0, "the host did not put the sandbox in its cgroup")


def init_and_wait(status):
    """Fork; the parent stays as the pid namespace's init and exits with the program's status."""
    child = os.fork()
    if child == 0:
        return
    os.close(status)
    while True:
        pid, status = os.wait()
        if pid == child:
            os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main():
    spec = json.loads(sys.argv[1])
    status = spec["status_fd"]
    try:
        if spec.get("root"):
            build_root(spec["root"], spec)
            drop_capabilities()
        if spec.get("seccomp"):
            install_seccomp(bytes.fromhex(spec["seccomp"]))
        if spec.get("gate_fd") is not None:
            wait_for_cgroup(spec["gate_fd"])
        init_and_wait(status)
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
    except OSError as exc:
        os.write(status, f"setup-failed: {exc}\n".encode())
        os._exit(126)
    os.write(status, b"ready\n")
    argv = spec["argv"]
    if spec["pass_status"]:
        argv = argv + [str(status)]
    else:
        os.set_inheritable(status, False)
    try:
        os.execve(argv[0], argv, spec["env"])
    except OSError as exc:
        os.write(status, f"exec-failed: {exc}\n".encode())
        os._exit(127)


if __name__ == "__main__":
    main()
