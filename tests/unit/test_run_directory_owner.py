"""A run directory holds one run: ``astraflow run`` refuses a directory where the launcher ran
another run name or the other log backend, since the trainer would resume from that run's
checkpoints (measured before the check: the math example on Kafka in an embedded run's directory
resumed "at version 5 from offsets {0: 2560}" of a samples topic with no such records)."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import RunConfig, dump_config, load_config
from astraflow.core.errors import AstraFlowError
from astraflow.core.rundir import RunDir
from astraflow.infra.launch.launcher import refuse_another_runs_directory

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"


def ran(run_dir: Path, config: RunConfig) -> None:
    """What a launcher leaves in ``run_dir`` from its start: the resolved config and metrics.jsonl."""
    run_dir.mkdir(parents=True)
    dump_config(config, RunDir(run_dir).config)
    RunDir(run_dir).metrics.touch()


def test_the_same_run_resumes_in_its_directory(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    ran(tmp_path / "run", config)
    refuse_another_runs_directory(load_config(EXAMPLE, {"train.lr": 0.001}), tmp_path / "run")  # settings may change


def test_a_directory_of_the_embedded_log_refuses_a_kafka_run(tmp_path: Path) -> None:
    ran(tmp_path / "run", load_config(EXAMPLE))
    kafka = load_config(EXAMPLE, {"log.backend": "kafka", "log.bootstrap": "127.0.0.1:9092"})
    with pytest.raises(
        AstraFlowError, match="holds run 'math' on the embedded log, and this is run 'math' on the kafka"
    ):
        refuse_another_runs_directory(kafka, tmp_path / "run")


def test_a_directory_refuses_another_run_name(tmp_path: Path) -> None:
    ran(tmp_path / "run", load_config(EXAMPLE))
    with pytest.raises(AstraFlowError, match="Give this run its own --run-dir"):
        refuse_another_runs_directory(load_config(EXAMPLE, {"run": "other"}), tmp_path / "run")


def test_a_directory_the_launcher_never_ran_in_takes_any_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_config(load_config(EXAMPLE), RunDir(run_dir).config)  # e.g. `astraflow warmup` alone: no metrics.jsonl
    refuse_another_runs_directory(load_config(EXAMPLE, {"run": "other"}), run_dir)
    refuse_another_runs_directory(load_config(EXAMPLE), tmp_path / "missing")
