"""What a local broker needs of the host: Java, a cluster id, and its JVM process found by pid.

``local.py`` starts and stops the broker with these; ``cluster.py`` picks its nodes' cluster id
with them. Free ports are ``astraflow.core.ports``'.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

from astraflow.core.errors import BrokerError


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in URL-safe base64 without padding (22 characters).

    Like Kafka's ``Uuid.randomUuid``, never one that starts with ``-``, which command lines
    (``kafka-storage format -t ID``) would read as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise BrokerError("Java ('java') is not on PATH; Kafka needs Java 17 or newer")
    return found


def listening(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return False
    return True


def is_kafka_process(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) ``kafka.Kafka`` JVM; reaps it if it is our child."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}")
    if not sys.platform.startswith("linux") or not proc.exists():
        return True
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    # An empty cmdline is a process between fork and exec (or in an exec): not a reused pid.
    return state != "Z" and (not cmdline or b"kafka.Kafka" in cmdline)


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_kafka_process(pid):
            return True
        time.sleep(0.1)
    return not is_kafka_process(pid)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
