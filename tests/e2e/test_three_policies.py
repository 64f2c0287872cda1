"""Three policies from config alone: ``astraflow run`` of the math example with ``policies`` declared.

No workflow names them: each policy plays every task on its own (``IndependentPolicies``) with
its own group size, and gets its own topics, stream processor, trainer (own learning rate and
batch size) and evaluator. The run stops at a number of versions; every policy must then have
learned (the mean of its last two held-out evaluations above its base), each trainer must have
trained groups of its policy's size, and the summary must report each policy.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from astraflow.infra.launch.monitor import gain_over_base
from astraflow.log import TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Trajectory
from tests.e2e.conftest import run_to_end, write_config

# long: left out of make test (time budget); the solver + verifier test covers several policies there
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(1200)]

MAX_VERSIONS = 40
MARGIN = 0.05
POLICIES = {
    "alpha": {},
    "beta": {"train": {"lr": 1e-4}},
    "gamma": {"rollout": {"group_size": 4}, "train": {"batch_samples": 128}},  # the same 32 tasks per version
}


def test_three_policies_train_side_by_side(run_dir: Path) -> None:
    # the policies share the example's model and warm-up, so their base checkpoint is the cached one
    config = write_config(
        run_dir / "test.yaml",
        run="trio",
        policies=POLICIES,
        rollout={"prompts_per_generation": 32},
        # the example's lr (3e-4) and ramp (30 versions) are for batches of 512, over hundreds of versions
        train={"batch_samples": 256, "lr": 1.5e-4, "lr_warmup_versions": 10},
        eval={"every_versions": 10},
        # on versions, never on the gain asserted below; the time cap only ends a run that is stuck
        stop={"max_versions": MAX_VERSIONS, "max_minutes": 12, "target_accuracy": None},
    )
    run_to_end(config, run_dir, timeout=1000)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["policies"]) == set(POLICIES)
    for name, policy in summary["policies"].items():
        assert policy["versions"] >= MAX_VERSIONS, (name, policy)
        accuracy = {int(version): value for version, value in policy["accuracy_by_version"].items()}
        assert gain_over_base(accuracy) >= MARGIN, (name, policy)  # 200 held-out rows: one evaluation is ±0.035

    codec = Codec()
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        for name, expected_group in (("alpha", 8), ("beta", 8), ("gamma", 4)):
            topic = f"trio.trajectories.{name}"
            partitions = [TopicPartition(topic, p) for p in log.end_offsets(topic)]
            with log.consumer() as consumer:
                consumer.assign(partitions)
                consumer.seek_to_beginning(partitions)
                trajectories = [
                    codec.decode(m.value, expect=Trajectory) for m in consumer.poll(max_records=2000, timeout=5.0)
                ]
            assert trajectories and {t.policy for t in trajectories} == {name}
            assert {t.group_size for t in trajectories} == {expected_group}
            sizes = Counter(t.group_id for t in trajectories)
            assert max(sizes.values()) == expected_group
