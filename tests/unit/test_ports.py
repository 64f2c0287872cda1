"""Free ports are picked below the kernel's ephemeral range, where no outgoing connection can take them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from astraflow.core import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_listened_on() -> None:
    start = ports.ephemeral_start()
    assert start is not None, "this host does not say its ephemeral range"
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST <= port < start
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()


class Scripted:
    """Stands in for the random choice: hands out the given ports in turn."""

    def __init__(self, *picks: int) -> None:
        self.picks = list(picks)

    def randrange(self, low: int, high: int) -> int:
        pick = self.picks.pop(0)
        assert low <= pick < high
        return pick


def test_a_span_of_ports_is_free_together_and_avoids_what_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports.free_port(span=3)
    assert all(ports.port_free(first + n) for n in range(3))
    other = ports.free_port(avoid=range(first, first + 3))
    monkeypatch.setattr(ports, "_random", Scripted(first, other))
    assert ports.free_port(avoid={first}) == other


def test_a_port_something_listens_on_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.free_port()))
        server.listen()
        busy = server.getsockname()[1]
        assert not ports.port_free(busy)
        other = ports.free_port(avoid={busy})
        monkeypatch.setattr(ports, "_random", Scripted(busy, other))
        assert ports.free_port() == other


def test_without_the_ephemeral_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_start() is None
    port = ports.free_port()
    assert ports.port_free(port)
