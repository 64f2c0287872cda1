"""Log clients stuck in a call that never returned: the process must exit without closing them.

A client library call that ignores its own timeout (see ``kafka_transactions``, step 7) is
abandoned on a watcher thread. Closing or destroying that client would wait on the same call, so
it is kept here, referenced for the life of the process, and ``launch.process.run_component``
ends the process at once (``os._exit``) when the component returns or fails with any client here.
"""

from __future__ import annotations

_STUCK: list[tuple[str, object]] = []


def note(what: str, client: object) -> None:
    """Keep ``client`` (never closed nor destroyed) and say what it was doing."""
    _STUCK.append((what, client))


def stuck() -> list[str]:
    """What each stuck client was doing, oldest first."""
    return [what for what, _ in _STUCK]
