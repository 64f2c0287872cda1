"""Remote regions on one machine: network namespaces behind a slow link to the host's broker.

A ``RemoteRegion`` is a network namespace joined to the host by a veth pair (host end
``10.R.N.1/30``, namespace end ``10.R.N.2/30``). Its link is slow the way a WAN link is:

- **bandwidth**: a ``tc ... tbf`` qdisc on both ends of the veth caps each direction at
  ``rate_mbit`` (egress shaping: the host end shapes what the region receives, the namespace end
  what it sends);
- **latency**: ``DelayProxy`` (``delay_proxy.py``) adds ``delay_ms`` each way, because ``netem``
  does not exist in this kernel.

Reaching Kafka from the region (``expose``): a Kafka client bootstraps, then connects to the
address the broker *advertises*; for the local broker that is ``127.0.0.1:PORT``, which inside
the namespace is the namespace's own loopback. So two processes carry every connection:

1. in the host namespace, the delay proxy in front of the broker: ``10.R.N.1:PORT`` →
   ``127.0.0.1:PORT`` with ``delay_ms`` each way;
2. in the region, a plain relay (no delay) on ``127.0.0.1:PORT`` → ``10.R.N.1:PORT``, across the
   capped veth.

Clients in the region then use the broker's own bootstrap address unchanged. On separate hosts the
relay is not needed: advertise the proxy's address on a listener of its own instead.

Creating namespaces needs root (or CAP_NET_ADMIN) and ``ip`` / ``tc`` from iproute2;
``RemoteRegion.available`` says whether this machine allows it, and why not.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from astraflow.core.errors import AstraFlowError

logger = logging.getLogger(__name__)
SUBNET_PREFIX = "10.213"


class NetnsError(AstraFlowError):
    """A namespace, veth pair, qdisc or relay could not be set up."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


class RemoteRegion:
    """One namespace with a capped veth to the host; a context manager that removes it on exit."""

    def __init__(self, name: str, rate_mbit: float = 20.0, delay_ms: float = 150.0) -> None:
        tag = secrets.token_hex(3)
        self.name = name
        self.netns = f"af-{name}-{tag}"
        self.host_if, self.region_if = f"af{tag}h", f"af{tag}r"
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.host_ip = self.region_ip = ""
        self._relays: list[subprocess.Popen] = []
        self._created = False

    @staticmethod
    def available() -> str | None:
        """``None`` when namespaces, veth pairs and tbf can be created here, else the reason."""
        if os.geteuid() != 0:
            return "network namespaces need root (CAP_NET_ADMIN); this process is not root"
        probe = RemoteRegion("probe", rate_mbit=10)
        try:
            probe.create()
        except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot create a network namespace with a tbf-capped veth here: {exc}"
        finally:
            probe.destroy()
        return None

    def create(self) -> "RemoteRegion":
        """Namespace, veth pair with addresses, tbf on both ends, loopback up."""
        subnet = _free_subnet()
        self.host_ip, self.region_ip = f"{SUBNET_PREFIX}.{subnet}.1", f"{SUBNET_PREFIX}.{subnet}.2"
        _ip("netns", "add", self.netns)
        self._created = True
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.region_if)
        _ip("link", "set", self.region_if, "netns", self.netns)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self.ip("addr", "add", f"{self.region_ip}/30", "dev", self.region_if)
        self.ip("link", "set", self.region_if, "up")
        self.ip("link", "set", "lo", "up")
        burst = max(16 * 1024, int(self.rate_mbit * 1e6 / 8 / 100))  # at least rate / HZ (100)
        shape = ["root", "tbf", "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "200ms"]
        for command in (
            ["tc", "qdisc", "add", "dev", self.host_if, *shape],
            ["ip", "netns", "exec", self.netns, "tc", "qdisc", "add", "dev", self.region_if, *shape],
        ):
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
            if result.returncode != 0:
                raise NetnsError(f"{' '.join(command)}: {result.stderr.strip()}")
        return self

    def ip(self, *args: str) -> subprocess.CompletedProcess:
        """``ip`` inside the namespace."""
        return _ip("netns", "exec", self.netns, "ip", *args)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` to run inside the namespace (same filesystem, environment and user)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def expose(self, bootstrap: str) -> str:
        """Make the broker at ``bootstrap`` (``127.0.0.1:PORT``) reachable from the region at the same
        address, over the slow link (module docstring); returns the address clients in the region use."""
        host, port = bootstrap.rsplit(":", 1)
        self._relay(
            [
                sys.executable,
                "-m",
                "astraflow.chaos.delay_proxy",
                "--listen",
                f"{self.host_ip}:{port}",
                "--upstream",
                f"{host}:{port}",
                "--delay-ms",
                str(self.delay_ms),
            ]
        )
        self._relay(
            self.argv(
                [
                    sys.executable,
                    "-m",
                    "astraflow.chaos.delay_proxy",
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--upstream",
                    f"{self.host_ip}:{port}",
                    "--delay-ms",
                    "0",
                ]
            )
        )
        return f"127.0.0.1:{port}"

    def _relay(self, argv: list[str]) -> None:
        errors = tempfile.TemporaryFile(mode="w+")
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
        self._relays.append(process)
        line = process.stdout.readline()
        if not line.startswith("listening"):
            process.kill()
            errors.seek(0)
            raise NetnsError(f"relay {' '.join(argv)} did not start: {line.strip()} {errors.read()[-2000:]}")

    def destroy(self) -> None:
        """Stop the relays and delete the namespace (which deletes the veth pair with it)."""
        for process in self._relays:
            process.terminate()
        for process in self._relays:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._relays.clear()
        if self._created:
            _ip("link", "del", self.host_if, check=False)
            _ip("netns", "del", self.netns, check=False)
            self._created = False

    def __enter__(self) -> "RemoteRegion":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _free_subnet() -> int:
    """A third octet N with no ``10.213.N.*`` address on the host yet."""
    used = _ip("-o", "addr", "show", check=False).stdout
    start = secrets.randbelow(254)
    for n in ((start + i) % 254 + 1 for i in range(254)):
        if f"{SUBNET_PREFIX}.{n}." not in used:
            return n
    raise NetnsError(f"every {SUBNET_PREFIX}.N.0/30 subnet is in use")
