"""A TCP proxy that adds a fixed delay each way: the latency of a slow link, in user space.

``netem`` does not exist in every kernel (not in this one), so the cross-region setup adds latency
here and caps bandwidth with ``tc ... tbf`` (``netns.py``). Each connection gets one pump per
direction: a reader stamps every chunk with ``arrival + delay`` and queues it, a writer sends each
chunk when its time comes. Chunks in flight queue up meanwhile, so the proxy delays bytes without
limiting throughput (as netem does; a sleep in the read loop would cap a connection at one chunk
per delay). The queue is bounded (``MAX_CHUNKS_IN_FLIGHT`` chunks of at most ``CHUNK_BYTES``), so
a fast sender meets TCP back-pressure rather than filling memory. Closing either side closes the
other once the bytes already queued are delivered.

Run it as ``python -m astraflow.chaos.delay_proxy --listen HOST:PORT --upstream HOST:PORT
--delay-ms 150``; it prints ``listening HOST:PORT`` once it accepts connections, and stops on
SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

logger = logging.getLogger(__name__)
CHUNK_BYTES = 64 * 1024
MAX_CHUNKS_IN_FLIGHT = 256


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class DelayProxy:
    """Listens on ``listen`` and forwards every connection to ``upstream``, ``delay_s`` late each way."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], delay_s: float) -> None:
        self.listen = listen
        self.upstream = upstream
        self.delay_s = delay_s
        self.connections = 0
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    async def start(self) -> tuple[str, int]:
        """Start listening; returns the bound address (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._handle, *self.listen)
        return self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        """Stop listening and drop the open connections."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        self._handlers.add(task)
        writers = [client_writer]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            writers.append(upstream_writer)
            await asyncio.gather(self._pump(client_reader, upstream_writer), self._pump(upstream_reader, client_writer))
        except OSError as exc:
            logger.warning("connection to upstream %s:%d failed: %s", *self.upstream, exc)
        except asyncio.CancelledError:
            pass  # the proxy is closing
        finally:
            self._handlers.discard(task)
            for writer in writers:
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``delay_s`` after it arrived."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_CHUNKS_IN_FLIGHT)

        async def read() -> None:
            try:
                while chunk := await reader.read(CHUNK_BYTES):
                    await queue.put((loop.time() + self.delay_s, chunk))
            except OSError:
                pass  # the peer reset the connection: end this direction like an EOF
            await queue.put((loop.time() + self.delay_s, b""))

        async def write() -> None:
            while True:
                due, chunk = await queue.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()

        reading = asyncio.create_task(read())
        try:
            await write()
        except OSError:
            reading.cancel()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await reading
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()


async def serve(listen: str, upstream: str, delay_ms: float) -> None:
    """Run a proxy until SIGTERM / SIGINT (the command-line entry point)."""
    proxy = DelayProxy(split_address(listen), split_address(upstream), delay_ms / 1000)
    host, port = await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"listening {host}:{port}", flush=True)
    await stop.wait()
    await proxy.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="TCP proxy adding a fixed delay in each direction.")
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward them to")
    parser.add_argument("--delay-ms", type=float, default=150.0, help="one-way delay added in each direction")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args.listen, args.upstream, args.delay_ms))


if __name__ == "__main__":
    main()
