"""No record can stop a run (issue #20): every kind of bad input, injected into a running pipeline.

A stream processor and a trainer run as ``astraflow stream`` / ``astraflow train`` processes on a
tiny model, on the embedded log with the native runtime and on a real Kafka broker with the faust
runtime. Before any good data, the test writes:

- to the samples topic, groups with one bad sample each (an advantage of 1e39, which is infinite in
  float32; per-token advantages of the wrong length or not finite; a token id outside the
  vocabulary; a sample longer than the context; a loss mask of 3; a group size of 0, which used to
  stall batch assembly), one good group, and two groups whose advantage of 3e38 is finite but
  makes the loss overflow;
- to the trajectories topic, groups with one bad trajectory each (a reward of 1e200, which used to
  end the run; a reward of 1e39, an infinite advantage under Dr.GRPO; a bad token id, length, loss
  mask, group size 0 and 9; a token version never published; a record too large to become a
  sample), after a group that never completes, written 10 minutes earlier in log time; and a group
  whose records are valid but one lacks the reward component the pipeline's ``reward_terms`` reads.

Then good groups. Each bad record must be dead-lettered with a reason naming its field, the
overflowing batch skipped without a version, and every good sample trained: the trainer ends at
exactly the version the good samples make (stopping at that version or a time limit).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from astraflow.chaos.pipeline_runs import CODEC, GROUP, MAX_POSITIONS, Pipeline, good_record
from astraflow.schemas.records import TrainSample, Trajectory

MiB = 1024 * 1024
VERSIONS = 4 + 4
"""What the good samples make: 4 batches written to the samples topic, 4 from 8 good trajectory groups."""


def trajectory(group: str, index: int, **changes: object) -> Trajectory:
    """Member ``index`` of a good group: rewards 1, 0, 1, 0 (so the group has a spread)."""
    return dataclasses.replace(good_record("trajectories", group, index), **changes)


BAD_ARRAYS = {
    "token-id": ({"response_ids": np.array([8, 5000, 1], dtype=np.int32)}, "response_ids: token id 5000"),
    "too-long": ({"prompt_ids": np.full(MAX_POSITIONS, 5, dtype=np.int32)}, "prompt_ids + response_ids: 67 tokens"),
    "loss-mask": ({"loss_mask": np.array([1, 3, 1], dtype=np.uint8)}, "loss_mask: values must be 0 or 1, found 3"),
    "group-size-0": ({"group_size": 0}, "group_size: 0 (an empty group)"),
}
"""Bad in a trajectory and in a sample alike: changes to member 0, and the start of the reason."""

BAD_TRAJECTORIES = {
    **BAD_ARRAYS,
    "reward-1e200": ({"reward": 1e200}, "reward: 1e+200 is beyond stream.max_abs_reward (1e+06)"),
    "reward-1e39": ({"reward": 1e39}, "reward: 1e+39 is beyond stream.max_abs_reward"),
    "group-size-9": ({"group_size": 9}, "group_size: 9, but the policy's rollout.group_size is 4"),
    "unpublished-version": (
        {"token_versions": np.array([0, 99, 0], dtype=np.int32)},
        "token_versions: version 99 is above the newest published version",
    ),
    "oversize": ({"response_text": "x" * (16 * MiB - 4000)}, "record size: record of"),
}


BAD_SAMPLES = {
    "advantage-1e39": ({"advantage": 1e39}, "advantage: 1e+39 is not a finite float32"),
    "token-advantages-length": (
        {"token_advantages": np.ones(2, dtype=np.float32)},
        "token_advantages: 2 values for 3 response tokens",
    ),
    "token-advantages-nan": (
        {"token_advantages": np.array([1.0, np.nan, 1.0], dtype=np.float32)},
        "token_advantages: not all finite",
    ),
}
"""Bad in a sample only: changes to the TrainSample of member 0 (not its trajectory), and the reason."""


def sample(group: str, index: int, advantage: float, **changes: object) -> TrainSample:
    return TrainSample(f"{group}/{index}", trajectory(group, index, **changes), advantage, 1000, ["dr_grpo"])


@pytest.mark.parametrize(
    "runtime", ["native", pytest.param("faust", marks=pytest.mark.kafka)], ids=["native-embedded", "faust-kafka"]
)
def test_bad_records_are_dead_lettered_and_the_run_trains_on(
    runtime: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    log = {"backend": "embedded"}
    if runtime == "faust":
        log = {"backend": "kafka", "bootstrap": request.getfixturevalue("kafka_bootstrap")}
    pipeline = Pipeline(tmp_path, runtime, log)
    try:
        pipeline.start("train")
        pipeline.start("stream")
        samples = pipeline.topics.samples("main")
        trainer_bad = {**BAD_ARRAYS, **BAD_SAMPLES}
        for name, (changes, _) in trainer_bad.items():
            if name in BAD_SAMPLES:
                bad = dataclasses.replace(sample(f"s-{name}", 0, 1.0), **changes)
            else:
                bad = sample(f"s-{name}", 0, 1.0, **changes)
            pipeline.write(samples, [bad] + [sample(f"s-{name}", i, (-1.0) ** i) for i in range(1, GROUP)])
        pipeline.write(samples, [sample("s-good", i, (-1.0) ** i) for i in range(GROUP)])
        overflowing = [sample(f"s-overflow{g}", i, 3e38) for g in range(2) for i in range(GROUP)]
        pipeline.write(samples, overflowing)  # one batch of its own: 8 groups of 4 came before it

        trajectories = pipeline.topics.trajectories("main")
        long_ago = int(time.time() * 1000) - 600_000  # twice stream.group_timeout_s before the records after it
        pipeline.write(trajectories, [trajectory("t-never-complete", i) for i in range(GROUP - 1)], long_ago)
        for name, (changes, _) in BAD_TRAJECTORIES.items():
            group = [trajectory(f"t-{name}", 0, **changes)] + [trajectory(f"t-{name}", i) for i in range(1, GROUP)]
            pipeline.write(trajectories, group)
        # valid records, but one lacks the component the pipeline's reward_terms reads: the group fails
        unshaped = [trajectory("t-no-found", 0, reward_components={"moves": 2.0})]
        pipeline.write(trajectories, unshaped + [trajectory("t-no-found", i) for i in range(1, GROUP)])
        pipeline.write(trajectories, [trajectory(f"t-good{g}", i) for g in range(8) for i in range(GROUP)])

        version, skipped = pipeline.wait_for_version(VERSIONS, timeout=300)
        pipeline.stop()
        letters = pipeline.dead_letters()
    finally:
        pipeline.close()

    assert version == VERSIONS and skipped == 1
    reasons = [letter.reason for letter in letters]
    for name, (_, cause) in trainer_bad.items():
        assert any(f"invalid sample s-{name}/0: {cause}" in r for r in reasons), (name, reasons)
    for name, (_, cause) in BAD_TRAJECTORIES.items():
        assert any(f"invalid trajectory t-{name}/0: {cause}" in r for r in reasons), (name, reasons)
    skipped_letters = [letter for letter in letters if letter.reason.startswith("batch skipped: loss")]
    assert sorted(CODEC.decode(letter.payload, expect=TrainSample).sample_id for letter in skipped_letters) == sorted(
        s.sample_id for s in overflowing
    )
    expired = [r for r in reasons if "group_size: incomplete: 3 of 4 members within stream.group_timeout_s" in r]
    assert len(expired) == GROUP - 1
    unshaped = [r for r in reasons if "reward_terms: trajectory t-no-found/0 has no reward component 'found'" in r]
    assert len(unshaped) == GROUP, reasons  # every member of the group, each with the name of what is missing
    assert len(letters) == len(trainer_bad) + len(BAD_TRAJECTORIES) + len(overflowing) + len(expired) + GROUP
