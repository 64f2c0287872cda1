"""Named crash points (``core/crashpoints.py``): every durable step of a stage has one, found from the
code, and arming one from outside a process kills that process there, by SIGKILL, on the pass it names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from astraflow.core.crashpoints import (
    ENV,
    RECORD_ENV,
    STAGE_MODULES,
    crash_point_names,
    find_crash_points,
)

SCRIPT = textwrap.dedent(
    """
    import sys
    from astraflow.core.crashpoints import crash_point
    for step in range(1, 4):
        print("before", step, flush=True)
        crash_point("demo.step", step)
        crash_point("demo.other")
    print("done", flush=True)
    """
)


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )


def test_every_durable_call_of_a_stage_follows_a_crash_point_of_its_own() -> None:
    sites = find_crash_points()
    gaps = [f"{site.module}:{site.line} {site.call}()" for site in sites if site.point is None]
    assert not gaps, "put crash_point(NAME, at) right before each of these calls:\n" + "\n".join(gaps)
    assert {site.module for site in sites} == set(STAGE_MODULES)  # each stage module has durable steps
    names = Counter(name for name, _, _ in crash_point_names())
    assert not [name for name, count in names.items() if count > 1], names  # one place per name
    assert {site.point for site in sites} <= set(names)
    print(f"\n{len(names)} crash points, {len(sites)} durable calls in {len(STAGE_MODULES)} stage modules")


def test_a_durable_call_without_a_crash_point_is_found(tmp_path: Path) -> None:
    (tmp_path / "stage.py").write_text(
        textwrap.dedent(
            """
            def step(producer, os, tmp):
                crash_point("stage.commit")
                producer.commit()
                if tmp:
                    producer.flush()
                with open(tmp) as handle:
                    crash_point("stage.fsync")
                    os.fsync(handle.fileno())
                os.rename(tmp, tmp + ".done")
            """
        )
    )
    sites = find_crash_points(tmp_path, ("stage.py",))
    assert [(site.call, site.point) for site in sites] == [
        ("commit", "stage.commit"),
        ("flush", None),
        ("fsync", "stage.fsync"),
        ("rename", None),
    ]


def test_an_armed_point_kills_the_process_by_sigkill_on_the_pass_or_value_it_names() -> None:
    unarmed = run({ENV: ""})
    assert unarmed.returncode == 0 and "done" in unarmed.stdout
    for armed, last in (("demo.step", 1), ("demo.step:2", 2), ("demo.other#3", 3), ("demo.step:3#3", 3)):
        died = run({ENV: armed})
        assert died.returncode == -signal.SIGKILL, (armed, died)
        assert died.stdout.split() == [word for step in range(1, last + 1) for word in ("before", str(step))]
        assert "crash point demo." in died.stderr  # the warning, flushed before the kill
    assert run({ENV: "demo.step:7,nothing.here"}).returncode == 0  # no match: runs through


def test_with_a_record_each_entry_fires_once_across_restarts(tmp_path: Path) -> None:
    """``a,a``: a process killed at a point, restarted, killed there again, restarted, then left alone."""
    env = {ENV: "demo.step:2,demo.step:2", RECORD_ENV: str(tmp_path)}
    codes = [run(env).returncode for _ in range(3)]
    assert codes == [-signal.SIGKILL, -signal.SIGKILL, 0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0", "1"]


def test_an_enospc_entry_raises_a_full_disk_there_instead_of_killing() -> None:
    full = run({ENV: "demo.step:2!enospc"})
    assert full.returncode == 1, full  # an exception, not a signal: the process's own code handles it
    assert full.stdout.split() == ["before", "1", "before", "2"]
    assert "OSError: [Errno 28] No space left on device (crash point demo.step)" in full.stderr
    unknown = run({ENV: "demo.step!full"})
    assert unknown.returncode == 1 and "unknown fault 'full'" in unknown.stderr, unknown
