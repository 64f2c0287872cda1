"""``astraflow tail`` prints, as JSON lines, records that another process wrote — on both backends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from astraflow.log import TopicSpec

ASTRAFLOW = Path(sys.executable).with_name("astraflow")
WRITER = """
import sys
from astraflow.log import open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Metric
kwargs = dict(arg.split("=", 1) for arg in sys.argv[2:])
with open_log(**kwargs) as log, log.producer() as producer:
    for i in range(5):
        metric = Metric("writer", "loss", i / 2, i, 1000 + i, {"run": "t"})
        producer.send(sys.argv[1], Codec().encode(metric), key=b"writer")
    producer.send(sys.argv[1], b"not avro at all")
    producer.flush()
"""


def test_tail_shows_records_of_another_process(log, log_target: dict[str, str], unique: str, tmp_path: Path) -> None:
    topic = f"tail-{unique}"
    log.create_topic(TopicSpec(topic, partitions=1))
    writer = subprocess.run(
        [sys.executable, "-c", WRITER, topic, *(f"{k}={v}" for k, v in log_target.items())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert writer.returncode == 0, writer.stderr
    where = (
        ["--bootstrap", log_target["bootstrap"]]
        if log_target["backend"] == "kafka"
        else ["--run-dir", str(Path(log_target["path"]).parent)]
    )
    tail = subprocess.run(
        [str(ASTRAFLOW), "tail", topic, *where, "--from-beginning", "--limit", "6"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [line["value"]["step"] for line in lines[:5]] == [0, 1, 2, 3, 4]
    assert lines[0]["type"] == "Metric" and lines[3]["value"]["value"] == 1.5
    assert "error" in lines[5] and lines[5]["bytes"] == len(b"not avro at all")


def test_tail_without_a_target_is_a_clear_error() -> None:
    result = subprocess.run([str(ASTRAFLOW), "tail", "x.metrics"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "exactly one of --run-dir" in result.stderr
