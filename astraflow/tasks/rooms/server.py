"""The bundled rooms game over the HTTP protocol of ``astraflow.envs.http``: an ``EnvServer`` of it.

``python -m astraflow.tasks.rooms.server --port 8765`` serves it until interrupted.
"""

from __future__ import annotations

import logging

from astraflow.envs.base import EpisodeEnv
from astraflow.envs.server import EnvServer
from astraflow.tasks.rooms.env import RoomsEnv, layout_from_reference

logger = logging.getLogger(__name__)


def rooms_factory(task: dict) -> EpisodeEnv:
    """The rooms game of a ``/reset`` request's task (its layout is the task's reference)."""
    return RoomsEnv(layout_from_reference(str(task["reference"])))


def main() -> None:
    """``python -m astraflow.tasks.rooms.server --port 8765``: serve the bundled rooms game until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(
        description="Serve the bundled room-navigation game over the reset/step HTTP protocol."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = EnvServer(rooms_factory, args.host, args.port)
    logging.basicConfig(level=logging.INFO)
    logger.info("serving the rooms game at %s", server.url)
    server.start()
    try:
        server.join()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
