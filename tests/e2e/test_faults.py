"""Reliability under faults (issue #8): kill -9 every kind of component, restart the broker; nothing is lost.

During a math run, ``FaultInjector`` SIGKILLs each component kind once (trainer, stream processor,
rollout producer, feeder, evaluator), a random 1-2 versions apart, each time waiting for the launcher
to start the replacement; on Kafka it also restarts the broker once (a dedicated ``LocalKafkaBroker``
with its own data, stopped and started on the same ports). Afterwards ``astraflow audit`` must find
every trajectory trained once, filtered or dead-lettered - none lost, none trained twice - and the
held-out accuracy must still have risen, in versions trained after the last fault. The test stops
the run (SIGTERM, as an operator would) once it has, or the run stops itself at ``MAX_VERSIONS``.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from astraflow.chaos.faults import KINDS, FaultError, FaultInjector, schedule
from astraflow.launch.monitor import gain_over_base
from tests.e2e.conftest import ASTRAFLOW, stop_processes, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MAX_VERSIONS = 40
AFTER_LAST_FAULT = 5
"""Versions the run must train after the last fault before it may stop on its gain."""
KILLS_PER_KIND = 1
"""Once per kind here (each kill costs ~10-20 s of restart, and on Kafka a session timeout);
``benchmarks/chaos.py`` kills each kind four times and restarts the broker twice."""
MARGIN = 0.05
"""Mean held-out exact match of the run's last two evaluations (after the last fault) over the base:
the clean main job gains 0.08-0.17 by versions 10-40 (benchmarks/results/main_job_summary.json); one
evaluation on 200 prompts varies by ~0.035, the mean of two by ~0.025."""


def fault_run(
    run_dir: Path, name: str, plan: list[str], *extra: str, broker=None
) -> tuple[dict, dict, FaultInjector, int]:
    """``astraflow run`` with ``plan`` injected; the run's summary, its audit (JSON), the injector and
    the version at which the test stopped the run."""
    config = write_config(
        run_dir / "test.yaml",
        run=name,
        eval={"every_versions": 5},
        stop={"max_minutes": 12, "max_versions": MAX_VERSIONS, "target_accuracy": None},
    )
    with (run_dir / "launcher.out").open("wb") as out:
        launcher = subprocess.Popen(
            [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    injector = FaultInjector(run_dir, launcher, seed=len(name), timeout_s=300)
    stopped_at = MAX_VERSIONS
    try:
        injector.run_schedule(plan, first_version=2, gaps=(1, 2), brokers=[broker] if broker else [])
        last_fault = injector.faults[-1].version
        try:
            injector.wait_for(
                "a gain after the last fault",
                lambda: (
                    injector.probe.version >= last_fault + AFTER_LAST_FAULT
                    and gain_over_base(injector.probe.accuracy, after=last_fault) >= MARGIN
                ),
                timeout_s=900,
            )
            stopped_at = injector.probe.version
            launcher.send_signal(signal.SIGTERM)
        except FaultError:
            pass  # the run reached MAX_VERSIONS first: ``check`` says whether it learned
        launcher.wait(timeout=900)
    finally:
        stop_processes([launcher])
    assert launcher.returncode == 0, (run_dir / "launcher.out").read_text()[-3000:]
    audit = subprocess.run(
        [str(ASTRAFLOW), "audit", str(run_dir), "--json"], capture_output=True, text=True, timeout=300
    )
    assert audit.stdout, audit.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text()), json.loads(audit.stdout), injector, stopped_at


def check(summary: dict, audit: dict, injector: FaultInjector, stopped_at: int) -> None:
    # every kill was survived: the launcher restarted each kind, and said so in the metrics
    restarted = Counter(name.split("-", 1)[0] for name, n in summary["restarts"].items() for _ in range(n))
    assert all(
        restarted[kind] >= KILLS_PER_KIND and injector.probe.restarts[kind] >= KILLS_PER_KIND for kind in KINDS
    ), (restarted, injector.report())
    # every trajectory has exactly one fate
    [policy] = audit["policies"]
    assert audit["ok"] and not policy["lost"] and not policy["trained_twice"], audit
    assert sum(policy["trained"].values()) >= summary["versions"] * 256, audit  # half a batch per version at least
    # and the run still learned after the last fault
    last_fault = injector.faults[-1].version
    assert summary["versions"] >= last_fault + AFTER_LAST_FAULT, (summary, injector.report())
    # evaluations the evaluator finished while the run stopped are left out: the stop was decided on the ones before
    accuracy = {
        int(version): value for version, value in summary["accuracy_by_version"].items() if int(version) <= stopped_at
    }
    assert gain_over_base(accuracy, after=last_fault) >= MARGIN, (summary, injector.report())


def test_embedded_run_survives_kills(run_dir: Path) -> None:
    summary, audit, injector, stopped_at = fault_run(
        run_dir, "faults", schedule(kills_per_kind=KILLS_PER_KIND, broker_restarts=0, seed=1)
    )
    check(summary, audit, injector, stopped_at)


def test_kafka_run_survives_kills_and_a_broker_restart(run_dir: Path, tmp_path: Path, unique: str) -> None:
    from astraflow.broker.local import LocalKafkaBroker, default_home, free_port
    from tests._broker import unavailable

    broker = LocalKafkaBroker(tmp_path / "broker", port=free_port(), jar_cache=default_home())
    try:
        broker.start(timeout=120)
    except Exception as exc:  # any start failure: a skip with the reason, fatal in CI
        unavailable(f"no Kafka broker for the fault test: {type(exc).__name__}: {exc}", exc)
    try:
        summary, audit, injector, stopped_at = fault_run(
            run_dir,
            f"faults{unique}",
            schedule(kills_per_kind=KILLS_PER_KIND, broker_restarts=1, seed=2),
            "--backend",
            "kafka",
            "--bootstrap",
            broker.bootstrap,
            broker=broker,
        )
    finally:
        broker.stop()
    assert [fault["kind"] for fault in injector.report()].count("broker") == 1
    check(summary, audit, injector, stopped_at)
