"""Doorbells of the embedded log: a reader waiting on a topic is woken when a writer appends to it.

Without them an idle ``poll`` sleeps 5 ms, doubling up to 20 ms, between reads of the file, so
every hand-off between processes (trainer -> producers -> stream processor -> trainer) waited
half of that on average before its records were even read. The SQLite file itself tells no one
that it changed, so the log keeps a small registry beside it:

1. a consumer that finds nothing to read opens a Unix datagram socket of its own (an address in
   Linux's abstract namespace: no file to clean up, gone with the process) and registers it, once,
   under every topic it reads: an empty file ``{log file}.bells/{topic}/{address}``;
2. a writer, right after the ``COMMIT`` that made records visible (a producer's flush, a
   transaction's commit), sends one byte to every address registered under their topics; a
   send to an address whose socket is gone (a reader that died) removes that registration;
3. the consumer waits on its socket instead of sleeping, with the same backoff as the timeout of
   that wait, so a lost ring (a full socket buffer, another network namespace, a platform without
   abstract sockets) costs the old polling delay, never a record: the ring is only a hint, the
   file stays the truth, and every wake-up reads it again.

A ring that comes between a reader's empty read and its wait is queued in its socket, so that
wait returns at once. Anyone who can reach the abstract namespace can ring: the worst is a read
that finds nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import select
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

SUPPORTED = sys.platform.startswith("linux")
"""Abstract socket addresses are Linux's; elsewhere readers poll on their timer alone."""


def bells_dir(log_path: Path) -> Path:
    """The registry of the log file ``log_path``."""
    return log_path.with_name(log_path.name + ".bells")


_PLAIN = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _topic_dir(root: Path, topic: str) -> Path:
    """A topic's directory: its name where that is a plain file name (Kafka's legal names are), else a hash."""
    if _PLAIN.fullmatch(topic) and topic not in (".", ".."):
        return root / topic
    return root / ("~" + hashlib.sha256(topic.encode()).hexdigest()[:32])


class Doorbell:
    """The waiting side: one socket per consumer, registered under the topics it reads."""

    def __init__(self, log_path: Path) -> None:
        self._root = bells_dir(log_path)
        self._name = f"astraflow-bell-{os.getpid()}-{secrets.token_hex(6)}"
        self._socket: socket.socket | None = None
        self._registered: dict[str, Path] = {}
        self._broken = not SUPPORTED

    def register(self, topics: Iterable[str]) -> bool:
        """Register under every topic of ``topics`` not registered yet (opening the socket first).
        True if it registered one: records appended before that rang no one, so read once more."""
        new = [topic for topic in topics if topic not in self._registered]
        if self._broken or not new:
            return False
        try:
            if self._socket is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                sock.bind("\0" + self._name)
                self._socket = sock
            for topic in new:
                directory = _topic_dir(self._root, topic)
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                entry = directory / self._name
                entry.touch(mode=0o600)
                self._registered[topic] = entry
        except OSError as exc:  # no abstract namespace here, a read-only directory: poll on the timer
            logger.debug("embedded log doorbell off (%s): readers poll on their timer", exc)
            self._broken = True
        return True

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ring; True if one came. Drains every queued ring."""
        if self._socket is None:
            time.sleep(max(0.0, timeout))
            return False
        ready, _, _ = select.select([self._socket], [], [], max(0.0, timeout))
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                self._socket.recv(64)
        return True

    def close(self) -> None:
        for entry in self._registered.values():
            with contextlib.suppress(OSError):
                entry.unlink()
        self._registered = {}
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def ring(log_path: Path, topics: Iterable[str]) -> None:
    """Wake every reader registered under ``topics`` of the log file ``log_path``."""
    if not SUPPORTED:
        return
    root = bells_dir(log_path)
    sock: socket.socket | None = None
    try:
        for topic in set(topics):
            try:
                entries = list(os.scandir(_topic_dir(root, topic)))
            except OSError:  # no reader ever registered there
                continue
            for entry in entries:
                if sock is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    sock.setblocking(False)
                try:
                    sock.sendto(b"\1", "\0" + entry.name)
                except (ConnectionRefusedError, FileNotFoundError):  # its reader is gone
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                except OSError:  # a full buffer: rings are already waiting there
                    pass
    finally:
        if sock is not None:
            sock.close()
