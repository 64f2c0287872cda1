"""JSON over HTTP to an environment server, bounded in time, size and destination.

An environment server is outside the run: slow, broken or hostile, it must cost one task (an
``EnvError``, the task dead-lettered with the reason), never a stalled producer or its memory.
``urllib``'s defaults do not bound that: its timeout is per socket read, so a server that drips a
byte a second holds a request for ever; it reads an answer of any size; it follows redirects to any
host; and it sends requests through the proxy that ``http_proxy`` / ``HTTPS_PROXY`` name.
``JsonClient`` speaks ``http.client`` directly instead:

- one **deadline per request** covers connecting, the TLS handshake, sending and reading the status
  line, headers and the whole body: every socket operation may only take the time left (name
  resolution, done by the C library, is the one step it cannot bound);
- the answer is read up to ``max_response_bytes`` (one byte more tells a full answer from a larger
  one), and one whose ``Content-Length`` announces more is refused before it is read;
- **no redirects**: a 3xx is an error naming the status and the host it points to;
- **no proxies**: ``http.client`` connects to the URL's host whatever the environment variables say;
- the URL's host must be on an **allow-list** (default: only that host), checked when the client is
  built, so with no redirects and no proxies nothing else is ever contacted;
- text the server chose (an error body, a malformed answer) is clipped to ``ERROR_TEXT_CHARS`` in
  any error message, so a dead letter does not carry a megabyte of it.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import ssl
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from astraflow.core.errors import clip as clip_to
from astraflow.envs.base import EnvError

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
"""Largest answer read by default (1 MiB): an observation and a score, with room to spare."""
ERROR_TEXT_CHARS = 300
"""Characters of server-supplied text kept in an error message."""
_READ_CHUNK = 64 * 1024
_ERROR_BODY_BYTES = 4 * ERROR_TEXT_CHARS  # of an error answer: enough for the clipped text


def clip(text: str) -> str:
    """``text`` cut to ``ERROR_TEXT_CHARS`` characters, for the errors of an environment's answers."""
    return clip_to(text, ERROR_TEXT_CHARS)


class _Deadline:
    """The time left of one request; ``TimeoutError`` once it is spent."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline reached")
        return left


class _DeadlineReader(io.RawIOBase):
    """Reads from a socket, each read limited to the request's time left (``http.client`` reads the
    status line, headers and body through this, so a dripping server meets the deadline anywhere)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self.sock.settimeout(self.deadline.left())
        return self.sock.recv_into(buffer)


class _DeadlineSocket:
    """The socket as ``http.client`` sees it: sends and reads within the deadline. Closing it does
    nothing: the response may still be reading; ``_Connection.release`` closes the real socket."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock = sock
        self.deadline = deadline

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(self.deadline.left())
            view = view[self.sock.send(view) :]

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self.sock, self.deadline))

    def close(self) -> None:
        pass


class _Connection(http.client.HTTPConnection):
    """One request's connection: connect and TLS handshake within the deadline, then every socket
    operation through ``_DeadlineSocket``."""

    def __init__(self, host: str, port: int, deadline: _Deadline, tls: ssl.SSLContext | None) -> None:
        super().__init__(host, port)
        self.deadline = deadline
        self.tls = tls
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        sock = self._open_socket()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
                sock.settimeout(self.deadline.left())  # the handshake's total, not per read
                sock.do_handshake()
        except BaseException:
            sock.close()
            raise
        self.raw = sock
        self.sock = _DeadlineSocket(sock, self.deadline)

    def _open_socket(self) -> socket.socket:
        """Like ``socket.create_connection``, but every address tried shares the one deadline."""
        failure: OSError = OSError(f"no address for {self.host}")
        for family, kind, proto, _, address in socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self.deadline.left())
                sock.connect(address)
                return sock
            except OSError as exc:
                sock.close()
                if isinstance(exc, TimeoutError):
                    raise
                failure = exc
        raise failure

    def release(self) -> None:
        """Close the real socket too, once the request is over (``close`` alone leaves it open: on an
        answer that ends the connection ``getresponse`` closes before the body is read)."""
        self.close()
        if self.raw is not None:
            self.raw.close()
            self.raw = None


def checked_url(base_url: str, allowed_hosts: Iterable[str] = ()) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path prefix)`` of an environment server's base URL; ``EnvError`` unless
    it is ``http``/``https`` with a host on ``allowed_hosts`` (empty: any, i.e. its own)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EnvError(f"environment URL {base_url!r}: not an http:// or https:// URL with a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise EnvError(f"environment URL {base_url!r}: {exc}") from exc
    allowed = {host.strip("[]").lower() for host in allowed_hosts}
    if allowed and parts.hostname not in allowed:
        raise EnvError(f"environment URL {base_url!r}: host {parts.hostname!r} is not one of {sorted(allowed)}")
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


class JsonClient:
    """POSTs JSON objects to one environment server and returns its JSON object answers."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 10.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        scheme, self.host, self.port, self.prefix = checked_url(base_url, allowed_hosts)
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.tls = ssl.create_default_context() if scheme == "https" else None

    def post(self, path: str, body: dict) -> dict:
        """The answer to ``body`` at ``path``; ``EnvError`` for anything but a 2xx JSON object in time."""
        where = f"environment {self.base_url}{path}"
        connection = _Connection(self.host, self.port, _Deadline(self.timeout_s), self.tls)
        try:
            connection.request(
                "POST", self.prefix + path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            with connection.getresponse() as response:
                payload = self._read(response, where)
        except TimeoutError as exc:
            raise EnvError(f"{where}: no complete answer within the {self.timeout_s:g} s deadline") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise EnvError(f"{where} failed: {clip(f'{type(exc).__name__}: {exc}')}") from exc
        finally:
            connection.release()
        try:
            answer = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise EnvError(f"{where}: the answer is not JSON: {clip(str(exc))}") from exc
        if not isinstance(answer, dict):
            raise EnvError(f"{where} answered {type(answer).__name__}, not an object")
        return answer

    def _read(self, response: http.client.HTTPResponse, where: str) -> bytes:
        """The body of a 2xx answer, at most ``max_response_bytes``; ``EnvError`` for any other."""
        if 300 <= response.status < 400:
            target = urlsplit(response.getheader("Location") or "").hostname or "no other host"
            raise EnvError(
                f"{where} answered {response.status}, a redirect to {clip(target)}: redirects are not followed"
            )
        if not 200 <= response.status < 300:
            text = _read_upto(response, _ERROR_BODY_BYTES).decode("utf-8", "replace")
            raise EnvError(f"{where} answered {response.status}: {clip(text)}")
        cap, announced = self.max_response_bytes, response.length
        if announced is not None and announced > cap:
            raise EnvError(f"{where}: an answer of {announced:,} bytes exceeds the {cap:,} byte cap")
        body = _read_upto(response, cap + 1)
        if len(body) > cap:
            raise EnvError(f"{where}: the answer exceeds the {cap:,} byte cap")
        if announced is not None and len(body) < announced:
            raise EnvError(f"{where}: the answer ended after {len(body):,} of its {announced:,} bytes")
        return body


def _read_upto(response: http.client.HTTPResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (all of it when shorter), in chunks of ``_READ_CHUNK``."""
    chunks, size = [], 0
    while size < limit and (chunk := response.read1(min(_READ_CHUNK, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
