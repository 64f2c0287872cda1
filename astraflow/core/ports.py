"""Free TCP ports for the processes AstraFlow starts on one machine (brokers, process groups).

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in its ephemeral range, the range
outgoing connections take their local ports from, so between picking it and the server's own bind
any client connection on the machine can take it: a three-node broker start failed so in CI, its
controller port taken while the suite's other worker talked to Kafka. Ports below that range are
only ever taken by an explicit bind, so ``free_port`` picks one there, at random so that parallel
callers seldom pick the same one, and checks that nothing listens on it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below this lie well-known services' ports
TRIES = 200

_random = random.SystemRandom()  # not the seeded module state: test runners reseed it alike in every worker


def ephemeral_start() -> int | None:
    """The first port of the kernel's ephemeral range, or None where the host does not say."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def port_free(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:port now (bound as the JVM does, with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(avoid: Collection[int] = (), span: int = 1) -> int:
    """A port p on 127.0.0.1 with p ... p + span - 1 free now, below the ephemeral range, none in ``avoid``."""
    start = ephemeral_start()
    if start is not None and start - span > LOWEST + 1000:
        for _ in range(TRIES):
            port = _random.randrange(LOWEST, start - span + 1)
            ports = range(port, port + span)
            if not set(ports) & set(avoid) and all(port_free(p) for p in ports):
                return port
    for _ in range(TRIES):  # no range to keep out of: let the kernel choose
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ports = range(port, port + span)
        if port + span <= 65536 and not set(ports) & set(avoid) and all(port_free(p) for p in ports):
            return port
    raise OSError(f"no {span} free consecutive TCP port(s) on 127.0.0.1 after {TRIES} tries")
