"""Named crash points: places where a test can have a component process die, as ``kill -9`` would.

A guarantee about crashes is worth what the crashes it was tested with were worth: a kill by timer
lands wherever it lands and mostly misses the narrow windows (between a checkpoint's write and its
version's commit, say). So a stage calls ``crash_point(NAME, at)`` at each step whose interruption
matters, and a test arms one point from outside the process with the environment variable
``ASTRAFLOW_CRASH_AT``:

- ``NAME`` kills the process the first time it passes ``NAME``;
- ``NAME:AT`` kills it when it passes ``NAME`` with ``at`` equal to ``AT`` (e.g. the version).

The process sends itself SIGKILL: no exception unwinds, no ``finally`` runs, no buffer is flushed,
nothing is closed. Unarmed (the variable unset, as in every run), a crash point costs one dict
lookup.
"""

from __future__ import annotations

import logging
import os
import signal

ENV = "ASTRAFLOW_CRASH_AT"

logger = logging.getLogger(__name__)


def crash_point(name: str, at: object = None) -> None:
    """Die here by SIGKILL if ``ASTRAFLOW_CRASH_AT`` names this point (and ``at``, when it names one)."""
    armed = os.environ.get(ENV)
    if not armed:
        return
    point, _, value = armed.partition(":")
    if point != name or (value and value != str(at)):
        return
    logger.warning("crash point %s%s armed: killing this process (SIGKILL)", name, f" at {at}" if value else "")
    for handler in logging.getLogger().handlers:
        handler.flush()  # the warning is the test's evidence that the kill landed here; nothing else is flushed
    os.kill(os.getpid(), signal.SIGKILL)
