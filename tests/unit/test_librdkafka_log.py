"""librdkafka's repeated lines (one per client and broker thread, several a second while a broker
restarts) are held back to one per window, which says how many it stood for."""

from __future__ import annotations

import logging

from astraflow.log.kafka.librdkafka import LOGGER_NAME, RepeatFilter, librdkafka_logger


def line(text: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(LOGGER_NAME, level, __file__, 1, "%s", (text,), None)


def test_repeats_pass_once_per_window_and_say_how_many_they_stood_for() -> None:
    now = [0.0]
    keep = RepeatFilter(window_s=10.0, clock=lambda: now[0])
    refused = (
        "FAIL [rdkafka#consumer-{n}] 127.0.0.1:{port}/bootstrap: Connect failed: Connection refused (after {ms}ms)"
    )
    passed = []
    for step in range(50):  # five seconds of a restart, two clients on other ports
        now[0] = step * 0.1
        record = line(refused.format(n=4 + step % 2, port=50000 + step % 2, ms=step))
        if keep.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 1
    other = line("FAIL [rdkafka#producer-1] GroupCoordinator: Disconnected")
    assert keep.filter(other)  # another kind of line passes at once
    assert keep.filter(line(refused.format(n=4, port=1, ms=0), logging.WARNING))  # another level too
    now[0] = 10.5
    record = line(refused.format(n=4, port=50000, ms=7))
    assert keep.filter(record)
    assert record.getMessage().endswith("(49 more like it in the last 10 s not shown)")
    now[0] = 21.0
    fresh = line(refused.format(n=4, port=50000, ms=7))
    assert keep.filter(fresh) and "not shown" not in fresh.getMessage()


def test_the_clients_logger_has_one_filter() -> None:
    logger = librdkafka_logger()
    assert librdkafka_logger() is logger
    assert sum(isinstance(f, RepeatFilter) for f in logger.filters) == 1
