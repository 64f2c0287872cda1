"""On Kafka a run is its topics: ``astraflow run`` from a directory that did not write them refuses.

The run's topics (``{run}.*``) outlive its run directory. Before this check, a second ``astraflow
run`` of the math example under the same ``run`` name from a new directory attached to the first
run's topics, stopped at once on the first run's ``stop.max_versions`` and printed the first run's
held-out accuracy as its own, with no final model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.config import RunConfig, load_config, write_config_over
from astraflow.core.errors import AstraFlowError
from astraflow.core.rundir import RunDir
from astraflow.infra.launch.launcher import refuse_another_runs_topics
from astraflow.log import open_log
from astraflow.runtime.topics import RunTopics

ASTRAFLOW = Path(sys.executable).with_name("astraflow")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"


def kafka_run(path: Path, run: str, bootstrap: str) -> tuple[Path, RunConfig]:
    config = write_config_over(EXAMPLE, path, run=run, log={"backend": "kafka", "bootstrap": bootstrap})
    return config, load_config(config)


def test_a_new_directory_refuses_a_run_whose_topics_hold_records(
    tmp_path: Path, kafka_bootstrap: str, unique: str
) -> None:
    run = f"taken{unique}"
    config_path, config = kafka_run(tmp_path / "run.yaml", run, kafka_bootstrap)
    topics = RunTopics(run, config.workflow, config.policy_names())
    with open_log("kafka", bootstrap=kafka_bootstrap) as log:
        topics.ensure(log, config.log.partitions)
        refuse_another_runs_topics(config, tmp_path / "empty-topics")  # created, never written: a new run
        with log.producer() as producer:
            producer.send(topics.ledger(config.policy), b"a version some other directory trained")

    fresh = tmp_path / "second"
    result = subprocess.run(
        [str(ASTRAFLOW), "run", str(config_path), "--run-dir", str(fresh), "--no-dashboard"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"run '{run}' already has records on the Kafka cluster {kafka_bootstrap}" in result.stderr
    assert topics.ledger(config.policy) in result.stderr
    assert f"astraflow runs rm {run} --bootstrap {kafka_bootstrap}" in result.stderr
    assert not fresh.exists()  # refused before the warm-up and before anything was written

    owner = tmp_path / "first"  # the directory whose launcher created the topics keeps its metrics.jsonl
    owner.mkdir()
    RunDir(owner).metrics.touch()
    refuse_another_runs_topics(config, owner)


def test_the_embedded_log_lives_in_its_run_directory(tmp_path: Path, unique: str) -> None:
    config = load_config(EXAMPLE, {"run": f"local{unique}"})
    refuse_another_runs_topics(config, tmp_path / "new")  # nothing to look at: a new directory is a new run
    assert not (tmp_path / "new").exists()


def test_the_refusal_names_what_to_do(tmp_path: Path, kafka_bootstrap: str, unique: str) -> None:
    run = f"named{unique}"
    _, config = kafka_run(tmp_path / "run.yaml", run, kafka_bootstrap)
    topics = RunTopics(run, config.workflow, config.policy_names())
    with open_log("kafka", bootstrap=kafka_bootstrap) as log:
        topics.ensure(log, config.log.partitions)
        with log.producer() as producer:
            producer.send(topics.tasks(), b"a task of the other run")
    with pytest.raises(AstraFlowError, match="Give this run another name") as refused:
        refuse_another_runs_topics(config, tmp_path / "new")
    assert topics.tasks() in str(refused.value) and str(tmp_path / "new") in str(refused.value)
