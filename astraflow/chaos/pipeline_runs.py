"""A stream processor and a trainer as live processes on a tiny model, fed records by hand.

``Pipeline`` is a run directory with a tiny base model, its config and topics, the ``astraflow stream``
and ``astraflow train`` processes, and what a test or benchmark reads back: the trainer's versions
(its metrics), the dead letters, the ledger's sample ids per version, and how far each stage's
committed offset is behind its input (``lag``), from which a stall shows. ``good_record`` is the record
of each topic kind its reader takes: the malformed kinds (``malformed.py``) are made from it, and the
fuzz benchmark's recorded good stream is made of it.

Used by ``tests/integration/test_bad_records.py`` (issue #20) and ``benchmarks/fuzz.py`` (issue #52).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from astraflow.basemodel.tiny import TinyModelSpec, create_tiny_checkpoint
from astraflow.core.metric_names import STREAM_GROUP_REWARD, TRAIN_SKIPPED_STEPS, TRAIN_VERSION
from astraflow.log import TopicPartition, open_log
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import (
    DeadLetter,
    LedgerEntry,
    Metric,
    PromptStats,
    RolloutTask,
    TrainSample,
    Trajectory,
)

GROUP = 4
BATCH = 8
MAX_POSITIONS = 64
PIPELINE = [
    {"op": "staleness"},
    {"op": "reward_terms", "weights": {"found": 0.5}},
    {"op": "dr_grpo"},
    {"op": "zero_variance"},
]
"""The default pipeline under Dr.GRPO, with reward shaping that needs each trajectory's ``found``."""
CODEC = Codec()


def good_record(topic: str, group: str = "g", index: int = 0, run: str = "fuzz", group_size: int = GROUP) -> Any:
    """A record of topic kind ``topic`` its reader takes: member ``index`` of group ``group`` (rewards 1, 0,
    1, 0, so a group has a spread), of policy ``main`` of workflow ``math`` of run ``run``."""
    reward = float((index + 1) % 2)
    if topic == "trajectories":
        return Trajectory(
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
            reward=reward,
            reward_components={"found": reward},
            group_size=group_size,
        )
    if topic == "samples":
        trajectory = good_record("trajectories", group, index, run, group_size)
        return TrainSample(trajectory.trajectory_id, trajectory, (-1.0) ** index, 1000, ["dr_grpo"])
    if topic == "tasks":
        metadata = {"version.main": "0"}
        return RolloutTask(group, f"p-{group}", group, "math", "1 + 1 =", "2", group_size, 0, 0, metadata)
    if topic == "feedback":
        ids = [f"{group}/{i}" for i in range(group_size)]
        return PromptStats(f"p-{group}", group, "math", "main", 0, group_size, 0.5, 0.5, 0.5, False, "x", 0, ids)
    if topic == "metrics":
        return Metric("stream", STREAM_GROUP_REWARD, reward, index, 0, {"policy": "main"})
    if topic == "deadletter":
        where = (f"{run}.trajectories.main", 0, 10**9 + index)  # no record a test writes
        return DeadLetter("stream-fuzz-1", "invalid trajectory: reward: non-finite nan", "", *where, b"g", b"", 0)
    if topic == "schemas":
        fields = [{"name": "a", "type": "int"}, {"name": f"b{index}", "type": "string"}]
        return json.dumps({"type": "record", "name": f"{group}{index}", "namespace": "fuzz", "fields": fields})
    raise ValueError(f"no topic kind {topic!r}")


def good_group(topic: str, group: str, run: str = "fuzz", group_size: int = GROUP) -> list[Any]:
    """Every member of group ``group``: a group of the recorded good stream."""
    return [good_record(topic, group, index, run, group_size) for index in range(group_size)]


class Pipeline:
    """A run directory with a tiny base model, its topics, and the stream and trainer processes."""

    def __init__(
        self,
        root: Path,
        runtime: str,
        log: dict,
        *,
        name: str | None = None,
        pipeline: list[dict] | None = None,
        stream: dict | None = None,
    ) -> None:
        """A run in ``root/run`` of ``runtime`` on ``log`` (``open_log``'s arguments but the path); ``name``:
        the run's (by default from ``root``'s name, so a test's runs on one broker differ)."""
        name = name or f"bad{root.name[-12:].replace('_', '').replace('-', '')}"
        self.run_dir = root / "run"
        create_tiny_checkpoint(self.run_dir / "base", TinyModelSpec(max_positions=MAX_POSITIONS))
        config = {
            "run": name,
            "log": {**log, "partitions": 1},
            "rollout": {"group_size": GROUP},
            "train": {"batch_samples": BATCH, "checkpoint_every": 100},
            "stream": {"runtime": runtime, "max_staleness": 1000, "pipeline": pipeline or PIPELINE, **(stream or {})},
        }
        self.config = self.run_dir / "config.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = open_log(log["backend"], path=self.run_dir / "log.sqlite", bootstrap=log.get("bootstrap"))
        self.topics = RunTopics(name, "math", ("main",))
        self.topics.ensure(self.log, 1)
        self.producer = self.log.producer()
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, int] = {}
        """Restarts per component by ``wait_for_version(restart=True)``: each exit of a component."""

    def start(self, component: str) -> None:
        out = (self.run_dir / f"{component}.out").open("ab")
        self.processes[component] = subprocess.Popen(
            [sys.executable, "-m", "astraflow.cli", component, str(self.config), "--run-dir", str(self.run_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def write(self, topic: str, records: list, timestamp_ms: int | None = None) -> None:
        """Encode ``records`` (Trajectories or TrainSamples) to ``topic``, keyed by group id."""
        for record in records:
            key = (record.trajectory if isinstance(record, TrainSample) else record).group_id.encode()
            self.producer.send(topic, CODEC.encode(record), key=key, timestamp_ms=timestamp_ms)
        self.producer.flush()

    def wait_for_version(
        self, version: int, timeout: float, restart: bool = False, on_poll: Callable[[], None] | None = None
    ) -> tuple[int, int]:
        """Follow the metrics topic until ``train.version`` reaches ``version`` or ``timeout`` passes;
        the last (version, skipped steps) seen. A component that exits fails this at once, or with
        ``restart`` is started again and counted in ``restarts``; ``on_poll`` runs after each poll."""
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
                    if metric.name == TRAIN_VERSION:
                        latest = max(latest, int(metric.value))
                    elif metric.name == TRAIN_SKIPPED_STEPS:
                        skipped = int(metric.value)
                for name, process in self.processes.items():
                    if process.poll() is None:
                        continue
                    assert restart, f"{name} exited with {process.returncode}: {self.output(name)}"
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    self.start(name)
                if on_poll is not None:
                    on_poll()
        finally:
            consumer.close()
        return latest, skipped

    def lag(self) -> dict[str, tuple[int, int]]:
        """Per stage (``stream``, ``train``): its group's committed offset on its input topic, and the
        input's end offset (summed over partitions)."""
        committed = self.log.group_offsets()
        inputs = {"stream": self.topics.trajectories("main"), "train": self.topics.samples("main")}
        found = {}
        for stage, topic in inputs.items():
            offsets = committed.get(f"{self.topics.run}.{stage}.main", {})
            done = sum(offset for tp, offset in offsets.items() if tp.topic == topic)
            found[stage] = (done, sum(self.log.end_offsets(topic).values()))
        return found

    def output(self, component: str) -> str:
        return (self.run_dir / f"{component}.out").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for name, process in self.processes.items():
            assert process.wait(timeout=90) == 0, f"{name} exited with {process.returncode}: {self.output(name)}"

    def dead_letters(self) -> list[DeadLetter]:
        """Every role's dead letters (records on their topics that are none - a fuzzer's - are left out)."""
        found = [record for topic in self.topics.deadletter_topics() for _, record in decode_snapshot(self.log, topic)]
        return [record for record in found if isinstance(record, DeadLetter)]

    def ledger(self) -> dict[int, list[str]]:
        """The sample ids of each trained version (the trainer's ledger, ``step`` entries)."""
        entries = [record for _, record in decode_snapshot(self.log, self.topics.ledger("main"))]
        return {e.version: e.sample_ids for e in entries if isinstance(e, LedgerEntry) and e.kind == "step"}

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        self.producer.close()
        self.log.close()
