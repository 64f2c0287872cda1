"""The HTTP environment client against misbehaving local servers (issue #23, item 5).

A server that drips its answer, sends too much, redirects elsewhere or answers garbage must cost
one task - an ``EnvError`` naming the cause, its server text clipped - within the request deadline;
no request may reach a host other than the configured one, whatever the proxy variables say.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from astraflow.config import AgentConfig, parse_config
from astraflow.core.errors import ConfigError
from astraflow.envs.base import EnvError
from astraflow.envs.http import HttpEnv
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.catalog import open_environments

TASK = RolloutTask("t@0", "t", "t@0", "http", "", "{}", 1, 0, 0)
CAP = 1 << 20  # the default answer size cap
DRIP_INTERVAL_S = 0.1  # well within any per-read timeout of the tests
Answer = Callable[["_Handler"], None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked answers need it
    server: ScriptedServer

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append((self.command, self.path, body))  # recorded before any answer
        try:
            self.server.answer(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should
        self.close_connection = True

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


class ScriptedServer(ThreadingHTTPServer):
    """A local HTTP server answering every request with ``answer``; records what it is asked."""

    daemon_threads = True

    def __init__(self, answer: Answer, host: str = "127.0.0.1") -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, bytes]] = []
        self.stopping = threading.Event()  # ends a drip when the test is over
        super().__init__((host, 0), _Handler)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(answer: Answer, host: str = "127.0.0.1") -> ScriptedServer:
        servers.append(ScriptedServer(answer, host))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def send(handler: _Handler, body: bytes, status: int = 200, framing: str = "length", **headers: str) -> None:
    """Answer with ``body`` framed by ``Content-Length``, by closing the connection, or in chunks."""
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    if framing == "length":
        handler.send_header("Content-Length", str(len(body)))
    elif framing == "chunked":
        handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    if framing == "chunked":
        for start in range(0, len(body), 100_000):
            piece = body[start : start + 100_000]
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        handler.wfile.write(b"0\r\n\r\n")
    else:
        handler.wfile.write(body)


def reset_answer(handler: _Handler) -> None:
    send(handler, json.dumps({"session": "s", "observation": "hello"}).encode())


def drip(handler: _Handler, head: bytes) -> None:
    """Send ``head``, then one byte every ``DRIP_INTERVAL_S`` for up to 5 s."""
    handler.wfile.write(head)
    for _ in range(50):
        handler.wfile.write(b" ")
        if handler.server.stopping.wait(DRIP_INTERVAL_S):
            return


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", id="body"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Slow: ", id="headers"),
    ],
)
def test_a_dripping_server_fails_at_the_deadline(serve: Callable[..., ScriptedServer], head: bytes) -> None:
    server = serve(lambda handler: drip(handler, head))
    env = HttpEnv(server.url, TASK, 0, timeout_s=1.0)  # each drip arrives 10x faster than 1 s
    started = time.monotonic()
    with pytest.raises(EnvError, match=r"/reset: no complete answer within the 1 s deadline"):
        env.reset()
    assert 0.9 < time.monotonic() - started < 1.9


@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_an_answer_over_the_size_cap_is_refused(serve: Callable[..., ScriptedServer], framing: str) -> None:
    server = serve(lambda handler: send(handler, b" " * (2 * CAP), framing=framing))
    with pytest.raises(EnvError, match=r"exceeds the 1,048,576 byte cap"):
        HttpEnv(server.url, TASK, 0).reset()


@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_an_answer_of_exactly_the_cap_is_read(serve: Callable[..., ScriptedServer], framing: str) -> None:
    answer = json.dumps({"session": "s", "observation": ""}).encode()
    padded = answer[:-1] + b" " * (4096 - len(answer)) + b"}"
    server = serve(lambda handler: send(handler, padded, framing=framing))
    assert HttpEnv(server.url, TASK, 0, max_response_bytes=4096).reset() == ""
    with pytest.raises(EnvError, match=r"exceeds the 4,095 byte cap"):
        HttpEnv(server.url, TASK, 0, max_response_bytes=4095).reset()


def test_an_answer_cut_short_is_an_error(serve: Callable[..., ScriptedServer]) -> None:
    server = serve(lambda handler: handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}"))
    with pytest.raises(EnvError, match=r"ended after 2 of its 100 bytes"):
        HttpEnv(server.url, TASK, 0).reset()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_errors_and_never_followed(serve: Callable[..., ScriptedServer], status: int) -> None:
    try:
        elsewhere = serve(reset_answer, host="127.0.0.2")  # another host, on the loopback
    except OSError:
        pytest.skip("127.0.0.2 cannot be bound here")
    server = serve(lambda handler: send(handler, b"", status=status, Location=f"{elsewhere.url}/reset"))
    with pytest.raises(EnvError, match=rf"/reset answered {status}, a redirect to 127\.0\.0\.2: redirects are not"):
        HttpEnv(server.url, TASK, 0).reset()
    assert len(server.requests) == 1 and elsewhere.requests == []


def test_proxy_variables_are_ignored(serve: Callable[..., ScriptedServer], monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = serve(lambda handler: send(handler, b'{"error": "proxied"}', status=502))
    server = serve(reset_answer)
    for name in ["http_proxy", "https_proxy", "all_proxy"]:
        monkeypatch.setenv(name, proxy.url)
        monkeypatch.setenv(name.upper(), proxy.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)  # as at start-up: urllib reads them once, into its opener
    assert HttpEnv(server.url, TASK, 0).reset() == "hello"
    assert proxy.requests == [] and [path for _, path, _ in server.requests] == ["/reset"]


def test_only_allowed_hosts_and_http_urls_are_accepted(serve: Callable[..., ScriptedServer]) -> None:
    server = serve(reset_answer)
    with pytest.raises(EnvError, match=r"host '127\.0\.0\.1' is not one of \['env\.example\.org'\]"):
        HttpEnv(server.url, TASK, 0, allowed_hosts=["env.example.org"])
    assert server.requests == []
    assert HttpEnv(server.url, TASK, 0, allowed_hosts=["ENV.example.org", "127.0.0.1"]).reset() == "hello"
    for url in ["file:///etc/passwd", "ftp://127.0.0.1/", "http:///no-host", "127.0.0.1:8765"]:
        with pytest.raises(EnvError, match="not an http:// or https:// URL with a host"):
            HttpEnv(url, TASK, 0)


def test_the_config_refuses_a_url_off_the_allow_list_at_load_time(serve: Callable[..., ScriptedServer]) -> None:
    agent = {"env_url": "http://10.1.2.3:8765", "env_allowed_hosts": ["env.example.org"]}
    with pytest.raises(ConfigError, match=r"agent: .*env_url's host '10\.1\.2\.3' is not in env_allowed_hosts"):
        parse_config({"rollout": {"workflow": "http_env", "reward": "env"}, "agent": agent})
    with pytest.raises(ConfigError, match=r"agent: .*env_url 'file:///etc/passwd' is not an http"):
        parse_config({"agent": {"env_url": "file:///etc/passwd"}})
    assert AgentConfig().env_max_response_bytes == CAP and AgentConfig().env_allowed_hosts == ()
    server = serve(lambda handler: send(handler, b" " * 2048))
    config = AgentConfig(env_url=server.url, env_max_response_bytes=1024, env_allowed_hosts=("127.0.0.1",))
    environments = open_environments("http_env", "env", config, None)
    with pytest.raises(EnvError, match=r"exceeds the 1,024 byte cap"):  # the config reaches the client
        environments(TASK, 0).reset()


def bad_status_line(handler: _Handler) -> None:
    handler.wfile.write(b"X" * 60_000 + b"\r\n\r\n")


@pytest.mark.parametrize(
    ("answer", "call", "cause"),
    [
        pytest.param(
            lambda handler: send(handler, json.dumps({"observation": "o" * 100_000, "reward": "y" * 100_000}).encode()),
            "step",
            "/step: malformed answer {'observation': 'ooo",
            id="malformed-step",
        ),
        pytest.param(lambda handler: send(handler, b"e" * 500_000, status=500), "reset", "answered 500: eee", id="500"),
        pytest.param(bad_status_line, "reset", "failed: BadStatusLine: XXX", id="status-line"),
        pytest.param(lambda handler: send(handler, b"[" * 500_000), "reset", "not JSON", id="deep-json"),
    ],
)
def test_server_text_in_errors_is_clipped(
    serve: Callable[..., ScriptedServer], answer: Answer, call: str, cause: str
) -> None:
    server = serve(answer)
    env = HttpEnv(server.url, TASK, 0)
    with pytest.raises(EnvError) as caught:
        env.step("go(north)") if call == "step" else env.reset()
    message = str(caught.value)
    assert cause in message and len(message) < 500, message[:1000]
