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
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from astraflow.basemodel.tiny import TinyModelSpec, create_tiny_checkpoint
from astraflow.log import TopicPartition, open_log
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, Metric, TrainSample, Trajectory

GROUP = 4
BATCH = 8
MAX_POSITIONS = 64
MiB = 1024 * 1024
CODEC = Codec()
VERSIONS = 4 + 4
"""What the good samples make: 4 batches written to the samples topic, 4 from 8 good trajectory groups."""


def trajectory(group: str, index: int, **changes: object) -> Trajectory:
    """Member ``index`` of a good group: rewards 1, 0, 1, 0 (so the group has a spread)."""
    good = Trajectory(
        trajectory_id=f"{group}/{index}",
        episode_id=f"{group}/{index}",
        group_id=group,
        task_id=group,
        prompt_id=f"p-{group}",
        policy="main",
        workflow="math",
        prompt_ids=np.array([5, 6, 7], dtype=np.int32),
        response_ids=np.array([8, 9, 1], dtype=np.int32),
        behaviour_logprobs=np.full(3, -2.0, dtype=np.float32),
        token_versions=np.zeros(3, dtype=np.int32),
        loss_mask=np.ones(3, dtype=np.uint8),
        reward=float((index + 1) % 2),
        reward_components={"found": float((index + 1) % 2)},
        group_size=GROUP,
    )
    return dataclasses.replace(good, **changes)


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


PIPELINE = [
    {"op": "staleness"},
    {"op": "reward_terms", "weights": {"found": 0.5}},
    {"op": "dr_grpo"},
    {"op": "zero_variance"},
]
"""The default pipeline under Dr.GRPO, with reward shaping that needs each trajectory's ``found``."""


def sample(group: str, index: int, advantage: float, **changes: object) -> TrainSample:
    return TrainSample(f"{group}/{index}", trajectory(group, index, **changes), advantage, 1000, ["dr_grpo"])


class Pipeline:
    """A run directory with a tiny base model, its topics, and the stream and trainer processes."""

    def __init__(self, tmp_path: Path, runtime: str, log: dict) -> None:
        self.run_dir = tmp_path / "run"
        create_tiny_checkpoint(self.run_dir / "base", TinyModelSpec(max_positions=MAX_POSITIONS))
        name = f"bad{tmp_path.name[-12:].replace('_', '').replace('-', '')}"
        config = {
            "run": name,
            "log": {**log, "partitions": 1},
            "rollout": {"group_size": GROUP},
            "train": {"batch_samples": BATCH, "checkpoint_every": 100},
            "stream": {"runtime": runtime, "max_staleness": 1000, "pipeline": PIPELINE},
        }
        self.config = self.run_dir / "config.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = open_log(log["backend"], path=self.run_dir / "log.sqlite", bootstrap=log.get("bootstrap"))
        self.topics = RunTopics(name, "math", ("main",))
        self.topics.ensure(self.log, 1)
        self.producer = self.log.producer()
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, component: str) -> None:
        out = (self.run_dir / f"{component}.out").open("wb")
        self.processes[component] = subprocess.Popen(
            [sys.executable, "-m", "astraflow.cli", component, str(self.config), "--run-dir", str(self.run_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def write(self, topic: str, records: list, timestamp_ms: int | None = None) -> None:
        for record in records:
            key = (record.trajectory if isinstance(record, TrainSample) else record).group_id.encode()
            self.producer.send(topic, CODEC.encode(record), key=key, timestamp_ms=timestamp_ms)
        self.producer.flush()

    def wait_for_version(self, version: int, timeout: float) -> tuple[int, int]:
        """Follow the metrics topic until ``train.version`` reaches ``version`` or ``timeout`` passes;
        the last (version, skipped steps) seen. Fails at once if a component exits."""
        consumer = self.log.consumer(group_id=None)
        consumer.assign([TopicPartition(self.topics.metrics("trainer"), 0)])
        consumer.seek_to_beginning()
        latest, skipped = -1, 0
        deadline = time.monotonic() + timeout
        try:
            while latest < version and time.monotonic() < deadline:
                for message in consumer.poll(max_records=500, timeout=0.5):
                    metric = CODEC.decode(message.value, expect=Metric)
                    if metric.component != "train":
                        continue
                    if metric.name == "train.version":
                        latest = max(latest, int(metric.value))
                    elif metric.name == "train.skipped_steps":
                        skipped = int(metric.value)
                for name, process in self.processes.items():
                    assert process.poll() is None, f"{name} exited with {process.returncode}: {self.output(name)}"
        finally:
            consumer.close()
        return latest, skipped

    def output(self, component: str) -> str:
        return (self.run_dir / f"{component}.out").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for name, process in self.processes.items():
            assert process.wait(timeout=90) == 0, f"{name} exited with {process.returncode}: {self.output(name)}"

    def dead_letters(self) -> list[DeadLetter]:
        return [record for topic in self.topics.deadletter_topics() for _, record in decode_snapshot(self.log, topic)]

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        self.producer.close()
        self.log.close()


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
