"""Two policies end to end: ``astraflow run examples/solver_verifier`` on the embedded log.

Solver and verifier each have their own base checkpoint, stream processor, trainer and evaluator
process; one rollout producer runs the workflow for both. Both trainers must publish versions,
both held-out metrics must rise above their bases (the solver's exact match, the verifier's
judgement accuracy on balanced true/false claims), and the system evaluator must report per
version pair. Runs in lockstep (what learns fastest on 2 cores). Measured (4 min, 2 cores shared
with other jobs at load 6-8, ~60-90 s of it start-up): solver 0.38 → 0.52 in 77 versions,
verifier 0.67 → 0.775 in 114, system accuracy with the verifier choosing 0.38 → 0.58 (alone 0.535).
Before the verifier learned it left the solver the CPU (144 versions, 0.38 → 0.605), so the
solver's margin is now +0.05 like the verifier's, on the mean of the last two evaluations.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from astraflow.launch.monitor import gain_over_base
from tests.e2e.conftest import ASTRAFLOW

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "solver_verifier" / "config.yaml"
# a cold warm-up of both policies is part of this test when nothing is cached
# long: left out of make test. Stopped on versions (70) it failed there once: the mean of the
# verifier's last two evaluations was 0.72 against its base 0.67, not above +0.05 (issue #26 is open on it)
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(1800)]


def test_solver_and_verifier_both_learn(run_dir: Path) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    # stops at a number of versions, never on the gain it asserts: the solver (the slower to learn)
    # reached ~0.47 by versions 60-70 in lockstep (benchmarks/results/multi_policy_real.json), the
    # verifier ~0.78; the time cap only ends a run that is stuck
    raw["run"], raw["stop"] = "sv", {"max_versions": 70, "max_minutes": 12}
    # on 2 shared cores on-policy learns more per second than async (benchmarks/multi_policy.py, part
    # real), and the evaluators took a quarter of the CPU at every 5 versions: leave it to training
    raw["mode"], raw["stream"] = "lockstep", {"max_staleness": 0}
    raw["eval"]["every_versions"] = 10
    config = run_dir / "test.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    policies = summary["policies"]
    assert set(policies) == {"solver", "verifier"}
    assert policies["solver"]["versions"] >= 20 and policies["verifier"]["versions"] >= 20, summary
    for policy in policies.values():  # both rise: 200 held-out rows, so one evaluation is ±0.035
        accuracy = {int(version): value for version, value in policy["accuracy_by_version"].items()}
        assert gain_over_base(accuracy) >= 0.05, policy
    for name, final in summary["final_models"].items():  # each policy's final version, for transformers
        assert final["version"] == policies[name]["versions"], (name, final)
        assert (run_dir / "final" / name / "config.json").is_file() and Path(final["path"]) == run_dir / "final" / name
    assert set(summary["final_models"]) == {"solver", "verifier"}
    system = summary["system_accuracy"]
    assert set(system["final"]) == {"alone", "judged", "majority", "pass_at_k", "judge_accuracy"}
    assert len(system["by_versions"]) >= 2
