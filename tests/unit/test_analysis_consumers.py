"""Analysis consumers on a recorded run (``recorded_run.py``): stats, report, export and runs.

Each reads the embedded log of a small run whose numbers are known, and none may disturb the
run: the consumer-group offsets, and a live group member's partitions, stay as they were.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from astraflow.analysis.export import export_topic
from astraflow.analysis.report_data import gather
from astraflow.analysis.report_page import write_report_files
from astraflow.analysis.runs import list_runs, remove_run, resolve_run, show_run
from astraflow.analysis.stats import collect_stats, reason_kind
from astraflow.analysis.tail import tail_topic
from astraflow.cli import app
from astraflow.core.errors import ConfigError, MissingDependencyError
from astraflow.log import TopicPartition
from astraflow.runtime.attach import open_run
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Metric, Trajectory, Turn
from tests.unit.recorded_run import RUN, STREAM_GROUP, TRAIN_GROUP, RecordedRun, record_run


@pytest.fixture
def recorded(tmp_path: Path) -> RecordedRun:
    return record_run(tmp_path / "runs" / RUN)


def test_stats_numbers(recorded: RecordedRun) -> None:
    with open_run(recorded.run_dir) as run:
        stats = collect_stats(run, window_s=60)
    by_topic = {row.topic: row for row in stats.throughput}
    assert by_topic[f"{RUN}.trajectories.main"].appended == 12
    assert by_topic[f"{RUN}.trajectories.verifier"].retained == 2
    assert sum(row.appended for name, row in by_topic.items() if ".metrics." in name) == len(recorded.metrics)
    assert stats.span_s == pytest.approx((len(recorded.metrics) - 1) * 1.0)
    assert by_topic[f"{RUN}.trajectories.main"].recent_per_s == pytest.approx(2 / 60)
    assert by_topic[f"{RUN}.samples.main"].recent_per_s == 0
    assert [(g.group, g.topic, g.committed, g.lag) for g in stats.lag] == [
        (STREAM_GROUP, f"{RUN}.trajectories.main", 10, 2),
        (TRAIN_GROUP, f"{RUN}.samples.main", 6, 2),
    ]
    assert stats.staleness == {0: 3, 1: 2, 2: 1}
    assert [(c.policy, c.version, c.trajectories, c.mean_reward) for c in stats.rewards] == [
        ("main", 0, 4, 0.25),
        ("main", 1, 4, 0.5),
        ("main", 2, 4, 0.75),
        ("verifier", 0, 2, 0.5),
    ]
    assert stats.drops == {"stale": 5, "zero_variance": 4}
    assert stats.dead_letters == {"undecodable trajectory": 1, "invalid trajectory": 1}


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("invalid trajectory g3/1: reward is NaN", "invalid trajectory"),
        ("workflow failed for task p3@1: boom", "workflow failed for task"),
        ("", "unknown"),
    ],
)
def test_reason_kind_drops_ids(reason: str, kind: str) -> None:
    assert reason_kind(reason) == kind


def test_analysis_leaves_the_live_run_undisturbed(recorded: RecordedRun, tmp_path: Path) -> None:
    """A stream member stays subscribed while every analysis consumer reads the run."""
    topic = f"{RUN}.trajectories.main"
    with recorded.log() as log, log.consumer(group_id=STREAM_GROUP) as member:
        member.subscribe([topic])
        for _ in range(50):
            if len(member.assignment()) == 2:
                break
            member.poll(max_records=1, timeout=0.1)
        before = log.group_offsets()
        with open_run(recorded.run_dir) as run:
            collect_stats(run)
        gather(recorded.run_dir)
        export_topic(log, topic, "jsonl", tmp_path / "t.jsonl")
        assert len(list(tail_topic(log, topic, from_beginning=True, limit=12))) == 12
        show_run(resolve_run(str(recorded.run_dir), tmp_path))
        assert log.group_offsets() == before
        member.poll(max_records=1, timeout=0.1)
        assert member.assignment() == [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        member.commit(before[STREAM_GROUP])  # still the only member: the fenced commit is accepted


def test_report_renders_every_file(recorded: RecordedRun, tmp_path: Path) -> None:
    data, run_dir = gather(recorded.run_dir)
    assert run_dir == recorded.run_dir and data.source == "log"
    assert {p: len(r.reward) for p, r in data.rewards.items()} == {"main": 12, "verifier": 2}
    written = write_report_files(data, tmp_path / "report")
    names = {
        "reward.png",
        "accuracy.png",
        "staleness.png",
        "throughput.png",
        "version_lag.png",
        "report.png",
        "report.html",
    }
    assert {p.name for p in written} == names
    for path in written:
        assert path.stat().st_size > 1000
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6 and 'src="' + "reward.png" not in page
    assert "0.600 at version 2" in page


def test_report_falls_back_to_metrics_jsonl(recorded: RecordedRun, tmp_path: Path) -> None:
    rows = [
        {"component": m.component, "name": m.name, "value": m.value, "step": m.step, "wall_s": i, "labels": m.labels}
        for i, m in enumerate(recorded.metrics)
    ]
    (recorded.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (recorded.run_dir / "log.sqlite").unlink()
    data, _ = gather(recorded.run_dir)
    assert data.source == "metrics.jsonl" and len(data.metrics["eval.accuracy"]) == 3
    assert len(write_report_files(data, tmp_path / "r")) == 7


def _trajectory_from_row(row: dict) -> Trajectory:
    """A Trajectory from an exported row (parquet maps arrive as (key, value) pairs)."""
    arrays = {
        "prompt_ids": np.int32,
        "response_ids": np.int32,
        "behaviour_logprobs": np.float32,
        "token_versions": np.int32,
        "loss_mask": np.uint8,
    }
    values = {k: v for k, v in row.items() if not k.startswith("_")}
    values.update({k: np.asarray(values[k], dtype=dtype) for k, dtype in arrays.items()})
    values["reward_components"] = dict(values["reward_components"])
    values["turns"] = [Turn(**turn) for turn in values["turns"]]
    return Trajectory(**values)


def stream_metrics(recorded: RecordedRun) -> list[Metric]:
    """The recorded metrics on the stream's topic, ``{RUN}.metrics.stream`` (``runtime/control.py``)."""
    return [metric for metric in recorded.metrics if metric.name.startswith("stream.")]


def _metric_from_row(row: dict) -> Metric:
    values = {k: v for k, v in row.items() if not k.startswith("_")}
    return Metric(**values | {"labels": dict(values["labels"])})


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize(
    ("topic", "rebuild", "kind"),
    [("trajectories.main", _trajectory_from_row, "main"), ("metrics.stream", _metric_from_row, "stream")],
)
def test_export_round_trips(
    recorded: RecordedRun, tmp_path: Path, fmt: str, topic: str, rebuild, kind: str | None
) -> None:
    if fmt == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / f"out.{fmt}"
    with recorded.log() as log:
        result = export_topic(log, f"{RUN}.{topic}", fmt, out)
    originals = recorded.trajectories[kind] if kind == "main" else stream_metrics(recorded)
    assert result.rows == len(originals) and not result.skipped
    rows = (
        [json.loads(line) for line in out.read_text().splitlines()]
        if fmt == "jsonl"
        else pq.read_table(out).to_pylist()
    )
    assert all({"_partition", "_offset", "_timestamp_ms"} <= row.keys() for row in rows)
    codec = Codec()
    assert sorted(codec.encode(rebuild(row)) for row in rows) == sorted(codec.encode(r) for r in originals)


def test_export_rejects_an_unknown_format(recorded: RecordedRun, tmp_path: Path) -> None:
    with recorded.log() as log, pytest.raises(ConfigError, match="--to: 'csv'"):
        export_topic(log, f"{RUN}.metrics.stream", "csv", tmp_path / "x.csv")


def test_parquet_without_pyarrow_says_how_to_install(
    recorded: RecordedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with recorded.log() as log, pytest.raises(MissingDependencyError, match="uv pip install pyarrow"):
        export_topic(log, f"{RUN}.metrics.stream", "parquet", tmp_path / "x.parquet")


def test_runs_ls_show_rm(recorded: RecordedRun, tmp_path: Path) -> None:
    root = recorded.run_dir.parent
    (infos,) = list_runs(root)
    assert (infos.name, infos.backend, infos.status, len(infos.topics), infos.appended("trajectories")) == (
        RUN,
        "embedded",
        "stopped",
        28,  # per policy: trajectories, samples, ledger, weights, episodes, the stream's changelog; tasks, feedback;
        14,  # and per writing role (7): metrics, dead letters
    )
    (recorded.run_dir / "summary.json").write_text(json.dumps({"final_accuracy": 0.6, "versions": 2}))
    shown = show_run(resolve_run(RUN, root))
    assert shown.status == "finished" and shown.summary["versions"] == 2
    assert {t.name: t.retained for t in shown.topics}[f"{RUN}.samples.main"] == 8
    assert [(g.group, g.lag) for g in shown.groups] == [(STREAM_GROUP, 2), (TRAIN_GROUP, 2)]
    with recorded.log() as log, log.producer() as producer:
        version = Metric("train", "train.version", 3, 3, int(time.time() * 1000))
        producer.send(f"{RUN}.metrics.trainer", Codec().encode(version))
        producer.flush()
    ref = resolve_run(RUN, root)
    assert show_run(ref).status == "live"
    with pytest.raises(ConfigError, match="is live"):
        remove_run(ref)
    removed = remove_run(ref, force=True)
    assert len(removed) == 29 and removed[-1] == str(recorded.run_dir)
    assert not recorded.run_dir.exists() and list_runs(root) == []
    with pytest.raises(ConfigError, match="no run 'demo'"):
        resolve_run(RUN, root)


def test_cli_commands(recorded: RecordedRun, tmp_path: Path) -> None:
    runner = CliRunner()
    stats = runner.invoke(app, ["stats", str(recorded.run_dir), "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output)["drops"] == {"stale": 5, "zero_variance": 4}
    assert runner.invoke(app, ["stats", str(recorded.run_dir)]).exit_code == 0
    exported = runner.invoke(
        app,
        [
            "export",
            f"{RUN}.metrics.stream",
            "--run-dir",
            str(recorded.run_dir),
            "--to",
            "jsonl",
            "--out",
            str(tmp_path / "m.jsonl"),
        ],
    )
    assert exported.exit_code == 0 and f"{len(stream_metrics(recorded))} records" in exported.output
    listed = runner.invoke(app, ["runs", "ls", "--root", str(recorded.run_dir.parent)])
    assert listed.exit_code == 0 and RUN in listed.output
    shown = runner.invoke(app, ["runs", "show", RUN, "--root", str(recorded.run_dir.parent)])
    assert shown.exit_code == 0 and STREAM_GROUP in shown.output
    tailed = runner.invoke(
        app,
        [
            "tail",
            f"{RUN}.trajectories.main",
            "--run-dir",
            str(recorded.run_dir),
            "--from-beginning",
            "--limit",
            "3",
            "--where",
            "reward>0",
            "--policy",
            "main",
        ],
    )
    assert tailed.exit_code == 0 and len(tailed.output.splitlines()) == 3
    reported = runner.invoke(app, ["report", str(recorded.run_dir), "--out", str(tmp_path / "rep")])
    assert reported.exit_code == 0 and (tmp_path / "rep" / "report.html").exists()
    removed = runner.invoke(app, ["runs", "rm", RUN, "--root", str(recorded.run_dir.parent), "--yes"])
    assert removed.exit_code == 0 and not recorded.run_dir.exists()
