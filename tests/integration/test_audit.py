"""``astraflow audit`` on a run recorded by hand: real Avro records on a real log, and a ledger.

The run (group size 2, one partition) holds a group of each fate: trained into versions 1, 2 and
3 (with a replayed copy, and copies that a crashed stream processor re-emitted, which the trainer
dropped), filtered by zero_variance, a NaN member dead-lettered with its sibling dropped as
incomplete, a corrupt member likewise, one group trained only into a version a crash lost (the
trainer restarted from version 3's checkpoint, so it is pending again) and one beyond the
stream's committed offset. The faulty run's ledger has version 3 train the re-emitted copies (so
those trajectories are trained twice) instead of g9, whose samples the trainer's offsets then
passed without a trace (lost), and a group that nothing accounts for.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from astraflow.analysis.audit import audit_run
from astraflow.cli import app
from astraflow.config import dump_config, parse_config
from astraflow.config.log import COMPONENT_ROLES
from astraflow.log import TopicPartition, open_log
from astraflow.runtime.attach import open_run
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import DeadLetter, LedgerEntry, OffsetRange, PromptStats, TrainSample, Trajectory


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


def record_run(run_dir: Path, log_section: dict, run: str, faulty: bool, retrain: bool = False) -> None:
    config = parse_config({"run": run, "rollout": {"group_size": 2}, "log": {**log_section, "partitions": 1}})
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    topics = RunTopics(run, "math", ("main",))
    codec = Codec()
    trajectories = [trajectory(g, i) for g in ("g1", "g2", "g3") for i in (0, 1)]
    trajectories += [trajectory("g4", 0, float("nan")), trajectory("g4", 1), b"garbage", trajectory("g5", 1)]
    trajectories += [trajectory(g, i) for g in ("g6", "g9") for i in (0, 1)]
    trajectories += [trajectory("g8", i) for i in (0, 1) if faulty]
    committed = len(trajectories)
    trajectories += [trajectory("g7", i) for i in (0, 1)]
    samples = [TrainSample(f"{g}/{i}", trajectory(g, i), 1.0, 3) for g in ("g1", "g2") for i in (0, 1)]
    samples += [TrainSample("g1/0#replay1", trajectory("g1", 0), 1.0, 3, replayed=True)]
    samples += [TrainSample(f"g2/{i}", trajectory("g2", i), 1.0, 3) for i in (0, 1)]  # re-emitted after a crash
    samples += [TrainSample(f"{g}/{i}", trajectory(g, i), 1.0, 3) for g in ("g9", "g6") for i in (0, 1)]
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
        stats("g9", ["g9/0", "g9/1"]),
    ]
    # samples 0-1 g1, 2-3 g2, 4 g1's replayed copy, 5-6 g2's copies, 7-8 g9, 9-10 g6; version 4 is lost
    # in a crash and epoch 2 restarts from version 3's checkpoint, publishing it as version 5
    third = ["g1/0#replay1"] + (["g2/0", "g2/1"] if faulty else ["g9/0", "g9/1"])
    ledger = [
        entry(1, "start", 0, (-1, -1), [], 0, 0),
        entry(1, "step", 1, (1, 0), ["g1/0", "g1/1"], 0, 2),
        entry(1, "step", 2, (1, 1), ["g2/0", "g2/1"], 2, 4),
        entry(1, "step", 3, (1, 2), third, 4, 9),
        entry(1, "step", 4, (1, 3), ["g6/0", "g6/1"], 9, 11),
        entry(2, "start", 5, (1, 3), [], 9, 9),
    ]
    if retrain:
        ledger.append(entry(2, "step", 6, (2, 5), ["g6/0", "g6/1"], 9, 11))
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
                producer.send(topics.deadletter(COMPONENT_ROLES[letter.origin.split("-")[0]]), codec.encode(letter))
            for record in feedback:
                producer.send(topics.feedback(), codec.encode(record))
            for record in ledger:
                producer.send(topics.ledger("main"), codec.encode(record))
            producer.flush()
        with log.consumer(group_id=f"{run}.stream.main") as stream:
            stream.assign([TopicPartition(traj_topic, 0)])
            stream.commit({TopicPartition(traj_topic, 0): committed})


def entry(
    epoch: int, kind: str, version: int, parent: tuple[int, int], ids: list[str], start: int, end: int
) -> LedgerEntry:
    ranges = [OffsetRange(0, start, end)] if end > start else []
    return LedgerEntry("main", kind, epoch, version, *parent, ranges, ids, {"0": end} if end else {})


@pytest.fixture
def log_section(backend: str, request: pytest.FixtureRequest) -> dict:
    if backend == "kafka":
        return {"backend": "kafka", "bootstrap": request.getfixturevalue("kafka_bootstrap")}
    return {"backend": "embedded"}


@pytest.mark.parametrize("faulty", [False, True], ids=["clean", "faulty"])
def test_audit_accounts_for_every_fate(tmp_path: Path, log_section: dict, unique: str, faulty: bool) -> None:
    run_dir = tmp_path / "run"
    record_run(run_dir, log_section, f"audit{unique}", faulty)
    with open_run(run_dir) as run:
        report = audit_run(run)
    [main] = report.policies
    assert main.records == 16 + 2 * faulty and main.items == 16 + 2 * faulty
    assert main.trained == ({1: 2, 2: 2} if faulty else {1: 2, 2: 2, 3: 2})
    assert main.filtered == {"zero_variance": 2, "incomplete": 2}
    assert main.dead_lettered == {"invalid: reward: non-finite nan": 1, "undecodable (SchemaError)": 1}
    assert main.pending == {"trainer": 2, "stream": 2}  # g6: trained only into the lost version 4
    assert main.accounted == (10 if faulty else 12) and main.replays_trained == 1
    assert (main.epochs, main.lost_versions, main.retrained) == (2, 1, 0)
    assert report.tasks_dead_lettered == {"workflow (RewardError)": 1}
    assert main.lost == (["g9/0", "g9/1", "g8/0", "g8/1"] if faulty else [])
    assert main.trained_twice == (["g2/0", "g2/1"] if faulty else [])
    assert main.copies_dropped == (0 if faulty else 2)
    assert report.ok is not faulty

    result = CliRunner().invoke(app, ["audit", str(run_dir)])
    assert result.exit_code == (1 if faulty else 0), result.output
    assert ("FAIL: 4 lost, 2 trained twice" if faulty else "OK: nothing lost, nothing trained twice") in result.output
    as_json = json.loads(CliRunner().invoke(app, ["audit", str(run_dir), "--json"]).output)
    assert as_json["ok"] is not faulty and as_json["policies"][0]["accounted"] == (10 if faulty else 12)


def test_samples_of_a_lost_version_trained_again_are_trained_once(
    tmp_path: Path, log_section: dict, unique: str
) -> None:
    run_dir = tmp_path / "run"
    record_run(run_dir, log_section, f"audit{unique}", faulty=False, retrain=True)  # epoch 2 trains g6 as 6
    with open_run(run_dir) as run:
        [main] = audit_run(run).policies
    assert main.trained == {1: 2, 2: 2, 3: 2, 6: 2} and main.trained_twice == [] and main.lost == []
    assert (main.lost_versions, main.retrained) == (1, 2) and main.pending == {"stream": 2}


def test_members_of_a_group_the_native_changelog_holds_are_pending_not_lost(
    tmp_path: Path, log_section: dict, unique: str
) -> None:
    run_dir, run = tmp_path / "run", f"audit{unique}"
    record_run(run_dir, log_section, run, faulty=True)  # g8: committed past, with no fate
    held = json.dumps([["g8", 0, [["g8/0", 14], ["g8/1", 15]], []]]).encode()
    with open_log(log_section["backend"], path=run_dir / "log.sqlite", bootstrap=log_section.get("bootstrap")) as log:
        with log.producer() as producer:  # what the native runtime journals for a half-filled group
            producer.send(f"{run}.stream.main.changelog", held, key=b"pending\x1f0")
            producer.flush()
    with open_run(run_dir) as opened:
        [main] = audit_run(opened).policies
    assert main.lost == ["g9/0", "g9/1"] and main.pending == {"trainer": 2, "stream": 4}


class Interleaved:
    """A run's log that runs ``action`` once, right before its ``at``-th read begins: a snapshot read's end
    offsets or the stream groups' committed offsets, the points where an audit takes a topic's state."""

    def __init__(self, log, at: int, action) -> None:
        self.log, self.at, self.action, self.reads = log, at, action, 0

    def __getattr__(self, name: str):
        return getattr(self.log, name)

    def _read(self) -> None:
        if self.reads == self.at:
            self.action(self.log)
        self.reads += 1

    def end_offsets(self, *args, **kwargs):
        self._read()
        return self.log.end_offsets(*args, **kwargs)

    def group_offsets(self, *args, **kwargs):
        self._read()
        return self.log.group_offsets(*args, **kwargs)


def stream_decides_g7(run: str, fate: str):
    """What a stream processor commits for the group beyond its offset (g7, offsets 14-15) in one transaction:
    its fate (dropped as zero variance, or a member dead-lettered and its sibling dropped) and the offset."""
    topics, codec = RunTopics(run, "math", ("main",)), Codec()

    def act(log) -> None:
        with log.producer() as producer:
            if fate == "filtered":
                producer.send(topics.feedback(), codec.encode(stats("g7", ["g7/0", "g7/1"], "zero_variance: equal")))
            else:
                letter = DeadLetter(
                    "stream-1", "invalid trajectory g7/0: bad", "", topics.trajectories("main"), 0, 14, b"g7", b"", 0
                )
                producer.send(topics.deadletter("stream"), codec.encode(letter))
                producer.send(topics.feedback(), codec.encode(stats("g7", ["g7/1"], "incomplete: 1 dead-lettered")))
            producer.flush()
        with log.consumer(group_id=f"{run}.stream.main") as stream:
            stream.assign([TopicPartition(topics.trajectories("main"), 0)])
            stream.commit({TopicPartition(topics.trajectories("main"), 0): 16})

    return act


@pytest.mark.parametrize("fate", ["filtered", "dead-lettered"])
def test_a_live_runs_audit_takes_nothing_decided_while_it_reads_for_lost(tmp_path: Path, fate: str) -> None:
    """The stream decides g7's fate and commits past it at each point where the audit starts a read, in turn:
    g7 is pending (decided after the audit read the committed offsets) or has its fate, never lost."""
    seen, at = set(), 0
    while True:
        run_dir, run = tmp_path / f"run{at}", f"live{at}"
        record_run(run_dir, {"backend": "embedded"}, run, faulty=False)
        with open_run(run_dir) as opened:
            opened.log = log = Interleaved(opened.log, at, stream_decides_g7(run, fate))
            report = audit_run(opened)
        [main] = report.policies
        assert main.lost == [] and report.ok, (at, main)
        # g3, g4/1, g5/1 filtered, g4/0 and g5/0 dead-lettered, g7 pending or decided (a member each way when the
        # audit read the dead letters before the action and the feedback after it)
        pending = main.pending.get("stream", 0)
        assert sum(main.filtered.values()) + sum(main.dead_lettered.values()) + pending == 4 + 2 + 2, (at, main)
        seen.add({2: "pending", 0: "decided"}.get(pending, "mixed"))
        if at >= log.reads:  # the action ran after the last read: the audit saw none of it
            break
        at += 1
    assert {"pending", "decided"} <= seen  # both sides of the race were walked
