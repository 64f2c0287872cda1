"""Serve any ``EpisodeEnv`` over the HTTP protocol of ``astraflow.envs.http`` (stdlib only).

``EnvServer(factory).start()`` listens on a free local port in a daemon thread; the factory builds
one environment per ``/reset`` from the task it is sent. Used by the tests, and as a template for
wrapping an external environment: the bundled rooms game is ``EnvServer(rooms_factory)``
(``astraflow.tasks.rooms.server``).
A request the server cannot serve answers 4xx/5xx with ``{"error": reason}``.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from astraflow.core.errors import AstraFlowError
from astraflow.envs.base import EpisodeEnv

logger = logging.getLogger(__name__)
ServedFactory = Callable[[dict], EpisodeEnv]
"""Builds an environment from the ``task`` object of a ``/reset`` request."""


class EnvServer:
    def __init__(self, factory: ServedFactory, host: str = "127.0.0.1", port: int = 0) -> None:
        self.factory = factory
        self.sessions: dict[str, EpisodeEnv] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="env-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "EnvServer":
        self._thread.start()
        return self

    def join(self) -> None:
        """Block until the server stops."""
        self._thread.join()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def handle(self, path: str, body: dict) -> dict:
        """One request's answer; ``KeyError`` / ``ValueError`` mean a bad request."""
        if path == "/reset":
            env = self.factory(body["task"])
            observation = env.reset()
            session = uuid.uuid4().hex
            with self._lock:
                self.sessions[session] = env
            return {"session": session, "observation": observation}
        with self._lock:
            env = self.sessions[body["session"]] if path == "/step" else self.sessions.pop(body["session"])
        if path == "/close":
            env.close()
            return {}
        result = env.step(str(body["action"]))
        score = env.reward()
        return {
            "observation": result.observation,
            "done": result.done,
            "reward": score["reward"],
            "info": {k: v for k, v in score.items() if k != "reward"},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    if self.path not in ("/reset", "/step", "/close"):
                        raise LookupError(f"no endpoint {self.path}")
                    status, answer = 200, server.handle(self.path, body)
                except (KeyError, ValueError, TypeError, LookupError) as exc:
                    status, answer = 400, {"error": f"{type(exc).__name__}: {exc}"}
                except AstraFlowError as exc:
                    status, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                logger.debug("env server: " + format, *args)

        return Handler
