"""The simulated cluster example end to end: ``astraflow run examples/solver_verifier/simulated_cluster.yaml``.

Its engine writes responses of up to 4,096 tokens for a model it only times, which the stream checks
against the base's context (``basemodel/cache.py`` records one that holds them). Nothing learns here
(a simulated trainer leaves the weights); what must hold is that records flow: both trainers publish
versions from trajectories the stream accepted, none dead-lettered, and the audit finds nothing lost.
Before the base's context held them the stream dead-lettered every long response and the run sat at
version 0 until its time cap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import run_audit, run_to_end

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "solver_verifier" / "simulated_cluster.yaml"
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_the_simulated_cluster_trains_versions_from_its_long_responses(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["run"], raw["stop"] = "simcluster", {"max_versions": 3, "max_minutes": 5}  # versions, the cap for a stall
    config, run_dir = tmp_path / "sim.yaml", tmp_path / "run"
    config.write_text(yaml.safe_dump(raw))
    run_to_end(config, run_dir, timeout=600)
    audited = run_audit(config, "--run-dir", run_dir)
    assert audited.returncode == 0, audited.stdout[-3000:] + audited.stderr[-3000:]
    policies = {p["policy"]: p for p in json.loads(audited.stdout)["policies"]}
    assert set(policies) == {"solver", "verifier"}
    for policy in policies.values():
        assert policy["dead_lettered"] == {} and policy["lost"] == [], policy
        assert max(map(int, policy["trained"]), default=0) >= 3, policy  # versions trained from accepted samples
