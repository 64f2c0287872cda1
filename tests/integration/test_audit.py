"""``astraflow audit`` on a run recorded by hand: real Avro records on a real log, one checkpoint.

The run (group size 2, one partition) holds a group of each fate: trained into versions 1 and 2
(with a replayed copy, and copies that a crashed stream processor re-emitted), filtered by
zero_variance, a NaN member dead-lettered with its sibling dropped as incomplete, a corrupt
member likewise, one group beyond the trainer's checkpoint and one beyond the stream's committed
offset. The faulty run adds a group that nothing accounts for, and a trainer that resumed
between the re-emitted copies, so it trained them twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from astraflow.analysis.audit import audit_run
from astraflow.attach import open_run
from astraflow.cli import app
from astraflow.config import dump_config, parse_config
from astraflow.log import TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, PromptStats, TrainSample, Trajectory
from astraflow.topics import RunTopics
from astraflow.training.checkpoint import TrainerState


def trajectory(group: str, index: int, reward: float = 1.0) -> Trajectory:
    ones = np.ones(2, dtype=np.int32)
    return Trajectory(
        f"{group}/{index}",
        f"{group}/{index}",
        group,
        group,
        group,
        "main",
        "math",
        ones,
        ones,
        np.full(2, -0.5, dtype=np.float32),
        ones * 0,
        np.ones(2, dtype=np.uint8),
        reward,
        group_size=2,
    )


def stats(group: str, ids: list[str], reason: str = "") -> PromptStats:
    return PromptStats(group, group, "math", "main", 0, len(ids), 0.5, 0.5, 0.5, not reason, reason, 0, ids)


def record_run(run_dir: Path, log_section: dict, run: str, faulty: bool, recall_window: int = 0) -> None:
    config = parse_config({"run": run, "rollout": {"group_size": 2}, "log": {**log_section, "partitions": 1}})
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    topics = RunTopics(run, "math", ("main",))
    codec = Codec()
    trajectories = [trajectory(g, i) for g in ("g1", "g2", "g3") for i in (0, 1)]
    trajectories += [trajectory("g4", 0, float("nan")), trajectory("g4", 1), b"garbage", trajectory("g5", 1)]
    trajectories += [trajectory("g6", i) for i in (0, 1)] + [trajectory("g8", i) for i in (0, 1) if faulty]
    committed = len(trajectories)
    trajectories += [trajectory("g7", i) for i in (0, 1)]
    samples = [TrainSample(f"{g}/{i}", trajectory(g, i), 1.0, 3) for g in ("g1", "g2") for i in (0, 1)]
    samples += [TrainSample("g1/0#replay1", trajectory("g1", 0), 1.0, 3, replayed=True)]
    samples += [TrainSample(f"g2/{i}", trajectory("g2", i), 1.0, 3) for i in (0, 1)]  # re-emitted after a crash
    samples += [TrainSample(f"g6/{i}", trajectory("g6", i), 1.0, 3) for i in (0, 1)]
    traj_topic = topics.trajectories("main")
    letters = [
        DeadLetter("stream-1", "invalid trajectory g4/0: reward: non-finite nan", "", traj_topic, 0, 6, b"g4", b"", 0),
        DeadLetter(
            "stream-1",
            "undecodable trajectory: not an Avro single-object record",
            "SchemaError",
            traj_topic,
            0,
            8,
            b"g5",
            b"garbage",
            0,
        ),
        DeadLetter(
            "rollout-1", "workflow failed for task p9@0: grader crashed", "RewardError", "", -1, -1, None, b"", 0
        ),
    ]
    feedback = [
        stats("g1", ["g1/0", "g1/1"]),
        stats("g2", ["g2/0", "g2/1"]),
        stats("g3", ["g3/0", "g3/1"], "zero_variance: all rewards equal"),
        stats("g4", ["g4/1"], "incomplete: 1 member(s) dead-lettered (g4/0)"),
        stats("g5", ["g5/1"], "incomplete: 1 member(s) dead-lettered (0@8)"),
        stats("g6", ["g6/0", "g6/1"]),
    ]
    with open_log(config.log.backend, path=run_dir / "log.sqlite", bootstrap=config.log.bootstrap) as log:
        topics.ensure(log, 1)
        with log.producer() as producer:
            for item in trajectories:
                value = item if isinstance(item, bytes) else codec.encode(item)
                key = b"g5" if isinstance(item, bytes) else item.group_id.encode()
                producer.send(traj_topic, value, key=key, partition=0)
            for sample in samples:
                producer.send(topics.samples("main"), codec.encode(sample), partition=0)
            for letter in letters:
                producer.send(topics.deadletter(), codec.encode(letter))
            for record in feedback:
                producer.send(topics.feedback(), codec.encode(record))
            producer.flush()
        with log.consumer(group_id=f"{run}.stream.main") as stream:
            stream.assign([TopicPartition(traj_topic, 0)])
            stream.commit({TopicPartition(traj_topic, 0): committed})
    # versions 1 and 2 trained g1 and g2, 3 the replayed copy, 4 the re-emitted copies (offsets 5, 6)
    history = [(1, {0: 2}), (2, {0: 4}), (3, {0: 5}), (4, {0: 7})]
    state = TrainerState(4, {0: 7}, 7, history, [{0: 5}] if faulty else [], recall_window)
    checkpoint = run_dir / "checkpoints" / "main" / "v00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(state.to_json())


@pytest.fixture
def log_section(backend: str, request: pytest.FixtureRequest) -> dict:
    if backend == "kafka":
        return {"backend": "kafka", "bootstrap": request.getfixturevalue("kafka_bootstrap")}
    return {"backend": "embedded"}


@pytest.mark.parametrize("faulty", [False, True], ids=["clean", "faulty"])
def test_audit_accounts_for_every_fate(tmp_path: Path, log_section: dict, unique: str, faulty: bool) -> None:
    run_dir = tmp_path / "run"
    record_run(run_dir, log_section, f"audit{unique}", faulty)  # a trainer without recall: memory empty after resuming
    with open_run(run_dir) as run:
        report = audit_run(run)
    [main] = report.policies
    assert main.records == 14 + 2 * faulty and main.items == 14 + 2 * faulty
    assert main.trained == {1: 2, 2: 2}
    assert main.filtered == {"zero_variance": 2, "incomplete": 2}
    assert main.dead_lettered == {"invalid: reward: non-finite nan": 1, "undecodable (SchemaError)": 1}
    assert main.pending == {"trainer": 2, "stream": 2}
    assert main.accounted == 10 and main.replays_trained == 1
    assert report.tasks_dead_lettered == {"workflow (RewardError)": 1}
    assert main.lost == (["g8/0", "g8/1"] if faulty else [])
    assert main.trained_twice == (["g2/0", "g2/1"] if faulty else [])
    assert main.copies_dropped == (0 if faulty else 2)
    assert report.ok is not faulty

    result = CliRunner().invoke(app, ["audit", str(run_dir)])
    assert result.exit_code == (1 if faulty else 0), result.output
    assert ("FAIL: 2 lost, 2 trained twice" if faulty else "OK: nothing lost, nothing trained twice") in result.output
    as_json = json.loads(CliRunner().invoke(app, ["audit", str(run_dir), "--json"]).output)
    assert as_json["ok"] is not faulty and as_json["policies"][0]["accounted"] == 10


def test_a_trainer_that_recalls_ids_after_resuming_drops_the_copies(
    tmp_path: Path, log_section: dict, unique: str
) -> None:
    run_dir = tmp_path / "run"
    record_run(
        run_dir, log_section, f"audit{unique}", faulty=True, recall_window=3
    )  # offsets 2..4 recalled: g2 included
    with open_run(run_dir) as run:
        [main] = audit_run(run).policies
    assert main.trained_twice == [] and main.copies_dropped == 2
    assert main.lost == ["g8/0", "g8/1"]


def test_members_of_a_group_the_native_changelog_holds_are_pending_not_lost(
    tmp_path: Path, log_section: dict, unique: str
) -> None:
    run_dir, run = tmp_path / "run", f"audit{unique}"
    record_run(run_dir, log_section, run, faulty=True)  # g8: committed past, with no fate
    held = json.dumps([["g8", 0, [["g8/0", 12], ["g8/1", 13]], []]]).encode()
    with open_log(log_section["backend"], path=run_dir / "log.sqlite", bootstrap=log_section.get("bootstrap")) as log:
        with log.producer() as producer:  # what the native runtime journals for a half-filled group
            producer.send(f"{run}.stream.main.changelog", held, key=b"pending\x1f0")
            producer.flush()
    with open_run(run_dir) as opened:
        [main] = audit_run(opened).policies
    assert main.lost == [] and main.pending == {"trainer": 2, "stream": 4}
