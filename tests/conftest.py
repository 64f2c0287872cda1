"""Shared fixtures: a real Kafka broker for the session, and a ``Log`` of either backend.

The broker comes from ``tests/_broker.py``: testcontainers' Kafka when a Docker engine answers,
otherwise the local KRaft broker that ``astraflow broker`` runs from the Maven Central jars. With
``CI=true`` a broker that cannot start fails the run instead of skipping the Kafka tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.log import Log, open_log

BACKENDS = ["embedded", "kafka"]


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a real Apache Kafka broker that lives for the whole test session."""
    from tests._broker import session_broker

    with session_broker(tmp_path_factory.mktemp("kafka")) as bootstrap:
        yield bootstrap


@pytest.fixture
def unique() -> str:
    """A short random suffix so tests sharing the session broker never share topics or groups."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def log_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """Keyword arguments for ``open_log`` that reach the same log from any process."""
    if backend == "kafka":
        return {"backend": "kafka", "bootstrap": request.getfixturevalue("kafka_bootstrap")}
    return {"backend": "embedded", "path": str(tmp_path / "log.sqlite")}


@pytest.fixture
def log(log_target: dict[str, str]) -> Iterator[Log]:
    """A ``Log`` of the parametrized backend."""
    with open_log(**log_target) as opened:
        yield opened


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """After the unit tests, how many commits changed the code under each committed benchmark figure
    since it ran (``benchmarks/staleness.py``), computed now so that it cannot go stale itself; and how
    many crash points the stages have (``core/crashpoints.py``), found from the code."""
    if not any(Path(arg).parts[-1:] == ("unit",) for arg in config.args):
        return
    from benchmarks import staleness  # the benchmarks folder is a namespace package of the repository

    terminalreporter.write_sep("-", "benchmark figures: commits on their paths since they ran")
    terminalreporter.write_line(staleness.table(staleness.figures()))
    from astraflow.core.crashpoints import STAGE_MODULES, crash_point_names, find_crash_points

    sites = find_crash_points()
    terminalreporter.write_sep("-", "crash points (core/crashpoints.py)")
    terminalreporter.write_line(
        f"{len(crash_point_names())} named crash points; {len(sites)} durable calls in {len(STAGE_MODULES)} stage "
        f"modules, {sum(site.point is None for site in sites)} without one"
    )
