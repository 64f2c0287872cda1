"""The main job end to end: ``astraflow run`` learns on the embedded log, and the loop runs on Kafka.

Both runs are real: every component is its own process, records are Avro on the log, the model
is trained by real gradients, and held-out accuracy is measured by the evaluator process.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from astraflow.infra.launch.monitor import gain_over_base
from astraflow.log import TopicPartition, open_log
from astraflow.runtime.topics import WEIGHTS_MANIFEST_PARTITION, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, Trajectory, WeightChunk
from astraflow.weights.signing import ManifestVerifier
from tests.e2e.conftest import ASTRAFLOW, write_config

# a cold warm-up (no cached base checkpoint) is part of the first test that needs it
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def run(config: Path, run_dir: Path, *extra: str, timeout: float) -> dict:
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def test_embedded_run_learns(math_run: Path) -> None:
    run_dir = math_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["versions"] >= 20 and summary["trajectories"] > 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["value"] for row in sorted(rows, key=lambda r: r["wall_s"]) if row["name"] == "stream.group_reward"]
    fifth = len(rewards) // 5
    early, late = sum(rewards[:fifth]) / fifth, sum(rewards[-fifth:]) / fifth
    # the sampled reward of thousands of groups rises: the policy improved through the log
    assert late >= early + 0.05, (early, late, summary)
    # held-out greedy exact match, measured by the evaluator process, is clearly above the base on
    # the mean of the last two evaluations (one of 200 prompts varies by ~0.035)
    accuracy = {int(version): value for version, value in summary["accuracy_by_version"].items()}
    assert gain_over_base(accuracy) >= 0.15, summary
    assert (run_dir / "report.png").stat().st_size > 10_000
    assert sum(row["name"] == "eval.accuracy" for row in rows) >= 3


def read_all(log, topic: str, partition: int | None = None) -> list:
    """Every record of ``topic`` (of one partition, given one) on the embedded log."""
    partitions = [partition] if partition is not None else range(log.describe_topic(topic).partitions)
    consumer = log.consumer(group_id=None)
    consumer.assign([TopicPartition(topic, p) for p in partitions])
    consumer.seek_to_beginning()
    messages = []
    while batch := consumer.poll(max_records=1000, timeout=0.0):
        messages.extend(batch)
    consumer.close()
    return messages


def test_the_run_signed_every_version_and_its_readers_took_them(math_run: Path) -> None:
    """The math run's weights are signed (``weights.signing_key``) and verified by every reader
    (``weights.verify_key``): each manifest on the topic verifies, no reader refused one, and the
    rollout producers sampled with the signed versions."""
    summary = json.loads((math_run / "summary.json").read_text())
    verifier = ManifestVerifier(math_run / "keys" / "weights-signing.pub.pem")
    codec = Codec()
    with open_log("embedded", path=math_run / "log.sqlite") as log:
        kept = [
            codec.decode(m.value, expect=WeightChunk)
            for m in read_all(log, "learn.weights.main", WEIGHTS_MANIFEST_PARTITION)
        ]
        letters = [
            codec.decode(m.value, expect=DeadLetter)
            for topic in RunTopics("learn", "math", ("main",)).deadletter_topics()
            for m in read_all(log, topic)
        ]
        newest = max(
            int(codec.decode(m.value, expect=Trajectory).token_versions.max())
            for m in read_all(log, "learn.trajectories.main")
        )
    assert kept and all(verifier.refusal(manifest, "learn.weights.main") is None for manifest in kept)
    assert {manifest.signer for manifest in kept} == {verifier.fingerprint}
    refused = [letter.reason for letter in letters if letter.topic == "learn.weights.main"]
    assert not refused, refused[:3]
    assert newest >= summary["versions"] // 2, (newest, summary["versions"])


def test_kafka_loop_advances_versions_and_producers_receive_them(
    run_dir: Path, kafka_bootstrap: str, unique: str
) -> None:
    """On Kafka, with the DeepSpeed ZeRO-2 trainer backend (its step-for-step equality with the
    torch backend is ``tests/integration/test_deepspeed_backend.py``; here it runs in the slice)."""
    pytest.importorskip("deepspeed", reason="needs deepspeed: scripts/setup.sh test deepspeed")
    config = write_config(
        run_dir / "test.yaml",
        run=f"k{unique}",
        stop={"max_minutes": 4, "max_versions": 4},
        train={"backend": "deepspeed", "deepspeed": {"zero_stage": 2}},
    )
    summary = run(config, run_dir, "--backend", "kafka", "--bootstrap", kafka_bootstrap, timeout=600)
    assert summary["versions"] >= 4 and summary["backend"] == "kafka"
    trainer_log = "".join(path.read_text(errors="replace") for path in (run_dir / "logs").glob("train*.out"))
    assert "trainer backend deepspeed (ZeRO stage 2" in trainer_log, trainer_log[-2000:]
    codec = Codec()
    newest_token_version = -1
    with open_log("kafka", bootstrap=kafka_bootstrap) as log:
        topic = f"k{unique}.trajectories.main"
        consumer = log.consumer()
        partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        while any(consumer.lag().values()):
            for message in consumer.poll(max_records=1000, timeout=2.0):
                newest_token_version = max(
                    newest_token_version, int(codec.decode(message.value, expect=Trajectory).token_versions.max())
                )
        consumer.close()
    # the producer sampled with weights the trainer published, not only the base checkpoint
    assert newest_token_version >= 2
