"""The tests driver: runs *inside* the sandbox and runs each of its programs once per test input.

Starting the sandbox and the interpreter was most of the cost of a run, so programs share one
sandbox, one after the other, and each test still gets a fresh process. Executed by the launcher
as ``python3 -I -c <this file> <config json> <status fd>`` in an empty ``/work``, with the
programs and their inputs on stdin (``{"programs": [{"source": ..., "stdins": [...]}]}``, base64),
so no program can see another's; like the launcher it imports nothing from AstraFlow. Steps:

1. Make this process non-dumpable (a program cannot open ``/proc/<driver>/fd/*``, read its memory
   or ptrace it, so it cannot forge the report) and a child subreaper (whatever a test leaves
   running is re-parented here, where it can be found); read the programs and inputs from stdin
   and close it; write ``driver-ready`` to the status fd and close it. A run without that line
   never ran a program: the host raises ``SandboxError``.
2. For each program in order, write it to ``/work/main.py``, and for each of its inputs in order,
   fork. The child sets its own RLIMIT_CPU (the driver's is sized for the whole batch), takes the
   input as fd 0 (a read-only fd of a fresh copy in memory: a regular file, as one on disk is) and
   two pipes as fds 1 and 2, closes every other fd, and runs ``main.py`` as ``__main__`` in the
   interpreter it inherited (no second start-up), then exits as
   ``python3 -I main.py`` would: a traceback and status 1 for an uncaught error, ``SystemExit``'s
   code, non-daemon threads joined, ``atexit`` run, std streams flushed (status 120 if that fails).
3. The driver reads both pipes until the child exits or ``wall_seconds`` pass (then SIGKILL:
   timed out) and keeps ``max_output_bytes`` of each (``truncated`` beyond). A stream past
   ``max_stream_bytes`` is closed, so further writes to it fail, as RLIMIT_FSIZE made them fail
   when output went to a file. Then it kills and reaps every process the test left, so each test
   starts alone.
4. After a program's last test, remove whatever it wrote (everything under ``/work``, ``/tmp``
   and ``/dev/shm``) and its System V IPC objects, so the next program starts in the sandbox the
   first one found; write ``{"program": p, "results": [...], "clean":
   ...}`` (outputs in base64) as one line to stdout. Where something could not be removed, the
   line says ``"clean": false`` and the driver stops: the host runs the remaining programs in a
   fresh sandbox. A program can kill the driver or break its own tests, never pass one, nor touch
   another program's: expected outputs are not in the sandbox, a program whose line is missing or
   not valid JSON fails every test on the host, and the host runs the programs after it again in a
   fresh sandbox.
"""

import atexit
import base64
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
import types

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
WORK, PROGRAM = "/work", "/work/main.py"
SCRATCH = ("/tmp", "/dev/shm")
IPC_RMID = 0
IPC_KINDS = (("shm", "shmctl"), ("msg", "msgctl"), ("sem", "semctl"))
CHUNK = 65536


def prctl(option, value):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def run_program(source, stdin, stdout, stderr, cpu_seconds):
    """In the forked child: become ``python3 -I main.py`` reading fd ``stdin``; never returns."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))  # the driver's own is the batch's
    os.dup2(stdin, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    main = types.ModuleType("__main__")
    main.__file__, main.__cached__ = PROGRAM, None
    sys.modules["__main__"] = main
    sys.argv = ["main.py"]
    try:
        exec(compile(source, PROGRAM, "exec"), main.__dict__)
        status = 0
    except SystemExit as exc:
        exit_like_the_interpreter(exit_status(exc.code))
    except BaseException as exc:  # uncaught by the program: printed as the interpreter would, minus this frame
        exc = exc.with_traceback(exc.__traceback__.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 1
    main.__dict__.pop("__file__", None)  # as the interpreter does once main.py is done
    main.__dict__.pop("__cached__", None)
    exit_like_the_interpreter(status)


def exit_status(code):
    """The status ``SystemExit(code)`` gives; any code but an int or ``None`` is printed."""
    if code is None or isinstance(code, int):
        return (code or 0) & 0xFF
    if sys.stderr is not None:
        sys.stderr.write(f"{code}\n")
    return 1


def exit_like_the_interpreter(status):
    """What the interpreter's exit does that a program can see, then ``os._exit(status)``.

    Its teardown proper is skipped: in a forked copy it touches, and so copies, every page of the
    heap, which cost as much as starting a fresh interpreter.
    """
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()  # join the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not getattr(stream, "closed", False):
                stream.flush()
        except Exception as exc:  # whatever the program's stream raises: the interpreter exits 120
            status = 120
            if stream is sys.stdout and sys.stderr is not None:
                sys.stderr.write(f"Exception ignored in: {stream!r}\n{type(exc).__name__}: {exc}\n")
    os._exit(status)


def children():
    """Processes whose parent is this driver (a subreaper: orphans of a test land here)."""
    me, found = str(os.getpid()), []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = stat.read().rsplit(")", 1)[1].split()[1]  # the name before ")" may hold anything
        except OSError:
            continue  # gone meanwhile
        if parent == me:
            found.append(int(name))
    return found


def kill_descendants():
    """SIGKILL and reap every descendant; a killed process's children are re-parented here first."""
    while True:
        pids = children()
        if not pids:
            return
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)


def input_file(data):
    """A read-only fd of a regular file in memory holding ``data``, positioned at its start."""
    fd = os.memfd_create("stdin")
    os.write(fd, data)
    reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    os.close(fd)
    return reader


def run_test(source, data, config):
    """Step 2 and 3 for one input: the child's status, outputs, and whether it timed out."""
    stdin = input_file(data)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            run_program(source, stdin, out_w, err_w, config["cpu_seconds"])
        finally:
            os._exit(1)  # whatever escaped the program's exit must not run the driver's code
    os.close(stdin)
    os.close(out_w)
    os.close(err_w)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in (out_r, err_r, pidfd):
        poller.register(fd, select.POLLIN)
    kept = {out_r: bytearray(), err_r: bytearray()}
    received = {out_r: 0, err_r: 0}  # bytes read from each stream that is still open
    cap, stream_cap = config["max_output_bytes"], config["max_stream_bytes"]
    deadline, exited, timed_out = started + config["wall_seconds"], False, False
    while not exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(remaining * 1000):
            if fd == pidfd:
                exited = True
                continue
            data = os.read(fd, CHUNK)
            received[fd] += len(data)
            kept[fd] += data[: cap + 1 - len(kept[fd])]
            if not data or received[fd] > stream_cap:
                poller.unregister(fd)
                os.close(fd)
                del received[fd]
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    wall_ms = (time.monotonic() - started) * 1000
    kill_descendants()
    for fd in received:  # every writer is gone now: read to the end
        while data := os.read(fd, CHUNK):
            kept[fd] += data[: cap + 1 - len(kept[fd])]
        os.close(fd)
    os.close(pidfd)
    code = os.waitstatus_to_exitcode(status)
    return {
        "exit_code": code if code >= 0 else 128 - code,
        "stdout": base64.b64encode(kept[out_r][:cap]).decode(),
        "stderr": base64.b64encode(kept[err_r][:cap]).decode(),
        "timed_out": timed_out,
        "wall_ms": wall_ms,
        "truncated": len(kept[out_r]) > cap or len(kept[err_r]) > cap,
    }


def remove_tree(path):
    """Remove ``path`` and everything under it, whatever modes a program gave them; False if it stays."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            for name in os.listdir(path):
                remove_tree(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def remove_ipc():
    """Remove the System V shared memory, queues and semaphores of this IPC namespace; False if one stays."""
    libc, clean = ctypes.CDLL(None, use_errno=True), True
    for kind, call in IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as table:
                ids = [int(line.split()[1]) for line in table.readlines()[1:] if line.strip()]
        except OSError:
            continue  # no System V IPC here: nothing to remove
        for ipc_id in ids:
            clean &= getattr(libc, call)(ipc_id, *((0,) if kind == "sem" else ()), IPC_RMID, None) == 0
    return clean


def clean_up():
    """Step 4: remove what the last program wrote; False where something stays."""
    clean = remove_ipc()
    for root in (WORK, *SCRATCH):
        if os.path.isdir(root):
            for name in os.listdir(root):
                clean &= remove_tree(os.path.join(root, name))
    return clean


def main():
    config, status = json.loads(sys.argv[1]), int(sys.argv[2])
    if sys.version_info < (3, 9):
        raise SystemExit("the tests driver needs Python 3.9 or later (os.pidfd_open)")
    os.close(os.pidfd_open(os.getpid()))  # the kernel has pidfds (Linux 5.3)
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    with os.fdopen(0, "rb") as stdin:
        batch = json.loads(stdin.read())
    programs = [
        (base64.b64decode(p["source"]), [base64.b64decode(data) for data in p["stdins"]]) for p in batch["programs"]
    ]
    os.write(status, b"driver-ready\n")
    os.close(status)
    for p, (source, stdins) in enumerate(programs):
        with open(PROGRAM, "wb") as program:
            program.write(source)
        os.chmod(PROGRAM, 0o444)
        results = [run_test(source, data, config) for data in stdins]
        clean = clean_up()
        sys.stdout.write(json.dumps({"program": p, "results": results, "clean": clean}) + "\n")
        sys.stdout.flush()
        if not clean:
            return


if __name__ == "__main__":
    main()
