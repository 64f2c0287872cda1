"""The logger librdkafka writes through, with its repeats held back.

librdkafka logs one line per broker thread and client for every failed attempt: while a broker
restarts, each client of a component writes ``Connect to ... failed: Connection refused`` several
times a second (one rollout producer wrote 193 such lines in one restart), which buries the lines
that say what happened. ``RepeatFilter`` passes the first line of a kind and then at most one per
``window_s``, which says how many like it it stood for. Lines are of one kind when they are equal
but for their numbers (client ids, ports, milliseconds).
"""

from __future__ import annotations

import logging
import re
import threading
import time

LOGGER_NAME = "astraflow.log.librdkafka"
_NUMBERS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Hold back a line equal, but for its numbers, to one passed less than ``window_s`` ago."""

    def __init__(self, window_s: float = 10.0, clock=time.monotonic, max_kinds: int = 512) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._max_kinds = max_kinds
        self._kinds: dict[tuple[int, str], tuple[float, int]] = {}  # kind -> (passed at, held back since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        kind = (record.levelno, _NUMBERS.sub("#", text))
        now = self._clock()
        with self._lock:
            passed, held = self._kinds.get(kind, (None, 0))
            if passed is not None and now - passed < self.window_s:
                self._kinds[kind] = (passed, held + 1)
                return False
            if len(self._kinds) >= self._max_kinds:
                self._kinds = {k: v for k, v in self._kinds.items() if now - v[0] < self.window_s}
            self._kinds[kind] = (now, 0)
        if held:
            record.msg, record.args = f"{text} ({held} more like it in the last {self.window_s:g} s not shown)", ()
        return True


def librdkafka_logger() -> logging.Logger:
    """The logger every Kafka client of the process hands to librdkafka, with one ``RepeatFilter``."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger
