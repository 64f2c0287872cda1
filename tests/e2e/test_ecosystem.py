"""What a run gives tools outside the project, end to end: the final policy as a Hugging Face
directory that plain transformers scores exactly as the evaluator did, any checkpointed version
through ``astraflow export-model``, TensorBoard event files, and a live Prometheus endpoint.

The recorded math run (``math_run``, shared with ``test_learning`` and ``test_replay``) is checked
for what it left; the endpoint is scraped during a short run of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astraflow.analysis.prometheus import exposed_name
from astraflow.core.metric_names import EVAL_ACCURACY, ROLLOUT_TRAJECTORIES, TRAIN_VERSION
from astraflow.log import TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import Metric
from tests.e2e.conftest import ASTRAFLOW, stop_processes, write_config
from tests.exporters import poll, read_scalars, start_serve, total

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

PLAIN_SCORE = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

directory, heldout, max_new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(line) for line in open(heldout)]
tokenizer = AutoTokenizer.from_pretrained(directory)
model = AutoModelForCausalLM.from_pretrained(directory).eval()
batch = tokenizer([row["prompt"] for row in rows], return_tensors="pt", padding=True, padding_side="left")
with torch.no_grad():
    out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens)
texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
# exact match: the answer is the response up to its first newline, without spaces
correct = sum(text.split("\\n", 1)[0].strip() == row["answer"] for text, row in zip(texts, rows))
assert not any(name.startswith("astraflow") for name in sys.modules), "project code was imported"
print(json.dumps({"score": correct / len(rows), "rows": len(rows)}))
"""


def evaluator_score(run_dir: Path, version: int, timeout: float = 300) -> float:
    """The held-out score an ``astraflow evaluate`` process started now gives ``version``: it scores
    the base, then the newest version on the weights topic (the run's last)."""
    codec = Codec()
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        metrics = TopicPartition("learn.metrics.evaluator", 0)
        start = log.end_offsets(metrics.topic)[0]
        evaluator = subprocess.Popen(
            [str(ASTRAFLOW), "evaluate", str(run_dir / "config.yaml"), "--run-dir", str(run_dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        consumer = log.consumer()
        try:
            consumer.assign([metrics])
            consumer.seek(metrics, start)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and evaluator.poll() is None:
                for message in consumer.poll(max_records=100, timeout=1.0):
                    metric = codec.decode(message.value, expect=Metric)
                    if metric.name == EVAL_ACCURACY and metric.step == version:
                        return metric.value
            raise AssertionError(f"the evaluator scored no version {version} (exit code {evaluator.poll()})")
        finally:
            consumer.close()
            stop_processes([evaluator])


def test_the_final_version_scores_with_plain_transformers_exactly_as_the_evaluator(math_run: Path) -> None:
    summary = json.loads((math_run / "summary.json").read_text())
    final = summary["final_models"]["main"]
    assert final["version"] == summary["versions"] and Path(final["path"]) == math_run / "final" / "main"
    plain = subprocess.run(
        [sys.executable, "-c", PLAIN_SCORE, final["path"], str(math_run / "data" / "heldout.jsonl"), "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    scored = json.loads(plain.stdout.splitlines()[-1])
    assert scored["rows"] == 200
    evaluated = evaluator_score(math_run, final["version"])
    assert scored["score"] == evaluated, (scored, evaluated)
    assert evaluated >= summary["base_accuracy"] + 0.1  # the trained policy, not the base


def test_export_model_writes_any_checkpointed_version(math_run: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from astraflow.config import load_config

    newest = json.loads((math_run / "summary.json").read_text())["final_models"]["main"]["version"]
    every = load_config(math_run / "test.yaml").train.checkpoint_every
    earlier = (newest - 1) // every * every  # the checkpoint before the final one (written at the stop)
    tensors = {}
    for version in (newest, earlier):
        out = tmp_path / f"v{version}"
        result = subprocess.run(
            [str(ASTRAFLOW), "export-model", str(math_run), "--version", str(version), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip() == f"{out}: version {version}"
        tensors[version] = load_file(out / "model.safetensors")
    final = load_file(math_run / "final" / "main" / "model.safetensors")
    assert final.keys() == tensors[newest].keys()
    assert all((final[name] == tensors[newest][name]).all() for name in final)  # the same version, bit for bit
    assert any((final[name] != tensors[earlier][name]).any() for name in final)  # trained apart
    gone = subprocess.run(
        [str(ASTRAFLOW), "export-model", str(math_run), "--version", "1", "--out", str(tmp_path / "v1")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert gone.returncode == 2 and f"checkpoints of versions [{earlier}, {newest}] only" in gone.stderr


def test_the_run_wrote_tensorboard_scalars_stepped_by_version(math_run: Path) -> None:
    summary = json.loads((math_run / "summary.json").read_text())
    scalars = read_scalars(math_run / "tensorboard")
    versions = scalars[TRAIN_VERSION]
    assert all(step == value for step, value in versions)
    assert versions[-1][0] == summary["versions"] and len(versions) >= summary["versions"]
    accuracy = {str(step): value for step, value in scalars[EVAL_ACCURACY]}
    assert accuracy == pytest.approx(summary["accuracy_by_version"], abs=1e-6)  # float32 in the event file
    rows = [json.loads(line) for line in (math_run / "metrics.jsonl").read_text().splitlines()]
    names = {row["name"] for row in rows}
    assert names <= set(scalars) and len(names) >= 15  # one scalar per metric


def test_the_prometheus_endpoint_follows_a_live_run(run_dir: Path) -> None:
    config = write_config(run_dir / "test.yaml", run="prom", stop={"max_versions": 12, "max_minutes": 6})
    with (run_dir / "run.out").open("w") as out:
        run = subprocess.Popen(
            [str(ASTRAFLOW), "run", str(config), "--run-dir", str(run_dir), "--no-dashboard"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    serve = None
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "log.sqlite").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the pace of polling for the run's log to appear
        assert (run_dir / "log.sqlite").exists(), (run_dir / "run.out").read_text()[-3000:]
        serve, url = start_serve(run_dir)
        trajectories, version = exposed_name(ROLLOUT_TRAJECTORIES) + "_total", exposed_name(TRAIN_VERSION)

        def alive() -> bool:
            return run.poll() is None and serve.poll() is None

        first = poll(url, lambda s: (total(s, version) or 0) >= 1 and (total(s, trajectories) or 0) > 0, 300, alive)
        seen_version, seen_trajectories = total(first, version), total(first, trajectories)
        later = poll(
            url,
            lambda s: total(s, version) > seen_version and total(s, trajectories) > seen_trajectories,
            300,
            alive,
        )
        assert total(later, version, run="prom", policy="main", component="train") > seen_version
        producers = {labels["producer"] for labels, _ in later[trajectories]}
        assert len(producers) == 1 and producers.pop().startswith("rollout-")
    finally:
        if serve is not None:
            stop_processes([serve])
        run.wait(timeout=600)
    assert run.returncode == 0, (run_dir / "run.out").read_text()[-3000:]
    assert serve.returncode == 0
    assert f"final model of main: {run_dir / 'final' / 'main'} (version " in (run_dir / "run.out").read_text()
