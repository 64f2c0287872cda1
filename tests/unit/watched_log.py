"""A real log whose consumers record what they read, and whose weights readers can be made to fail.

``WatchedLog(log)`` hands out ``log``'s own consumers, each wrapped: the messages its polls return
are appended to ``read``, and once ``fail`` is set a poll of a consumer assigned a weights topic
raises ``error`` instead, as a log on a failing disk or a lost broker would (fault injection: every
record still comes from the real log). Run as a module, it runs an ``astraflow`` command whose run
log is watched so, its weights reads failing from the start:

    python -m tests.unit.watched_log feed CONFIG --run-dir DIR
"""

from __future__ import annotations

import sys
import threading

from astraflow.log import Consumer, Log, Message

INJECTED = OSError(5, "injected: the weights log cannot be read")


class WatchedConsumer:
    def __init__(self, inner: Consumer, log: "WatchedLog") -> None:
        self._inner = inner
        self._log = log

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        if self._log.fail.is_set() and any(".weights." in tp.topic for tp in self._inner.assignment()):
            raise self._log.error
        messages = self._inner.poll(max_records=max_records, timeout=timeout)
        self._log.read += messages
        return messages

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def __enter__(self) -> "WatchedConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


class WatchedLog:
    def __init__(self, inner: Log, error: BaseException = INJECTED) -> None:
        self._inner = inner
        self.error = error
        self.fail = threading.Event()
        self.read: list[Message] = []

    def consumer(self, *args, **kwargs) -> WatchedConsumer:
        return WatchedConsumer(self._inner.consumer(*args, **kwargs), self)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def main() -> None:
    """``astraflow`` with every component's run log watched, its weights reads failing."""
    import astraflow.runtime.context
    from astraflow.cli import main as astraflow_main

    real = astraflow.runtime.context.open_run_log

    def failing(config, run_dir, component=None) -> WatchedLog:
        log = WatchedLog(real(config, run_dir, component))
        log.fail.set()
        return log

    astraflow.runtime.context.open_run_log = failing
    sys.argv = ["astraflow", *sys.argv[1:]]
    astraflow_main()


if __name__ == "__main__":
    main()
