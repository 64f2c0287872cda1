"""``astraflow metrics serve`` follows a run's metrics topic live, on both backends: records another
process writes after the endpoint started show up in the next scrapes, by the catalogue's kinds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from astraflow.config import load_config, write_config_over
from astraflow.core.metric_names import ROLLOUT_TRAJECTORIES, STREAM_STALENESS, TRAIN_VERSION
from astraflow.runtime.context import ComponentContext
from tests.exporters import poll, start_serve, total

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "math" / "config.yaml"


def test_the_endpoint_follows_the_metrics_topic_live(
    backend: str, tmp_path: Path, unique: str, request: pytest.FixtureRequest
) -> None:
    log = {"backend": backend}
    if backend == "kafka":
        log["bootstrap"] = request.getfixturevalue("kafka_bootstrap")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(write_config_over(EXAMPLE, run_dir / "config.yaml", run=f"m{unique}", log=log))
    trainer, producer, stream = (ComponentContext(config, run_dir, name) for name in ("train", "rollout", "stream"))
    serve = None
    try:
        trainer.metric(TRAIN_VERSION, 1, 1, policy="main")
        producer.metric(ROLLOUT_TRAJECTORIES, 64, 1, policy="main", region="local", hardware="cpu")
        for context in (trainer, producer):
            context.producer.flush()
        serve, url = start_serve(run_dir)
        alive = lambda: serve.poll() is None  # noqa: E731
        first = poll(url, lambda s: total(s, "astraflow_train_version") == 1, 60, alive)
        assert total(first, "astraflow_rollout_trajectories_total", run=f"m{unique}", policy="main") == 64
        assert total(first, "astraflow_train_version", component="train", producer=trainer.instance) == 1

        trainer.metric(STREAM_STALENESS, 99, 2, policy="main")  # not the trainer's to write: left out
        trainer.metric(TRAIN_VERSION, 2, 2, policy="main")  # after it on the trainer's topic: read after it
        producer.metric(ROLLOUT_TRAJECTORIES, 192, 2, policy="main", region="local", hardware="cpu")
        for staleness in (0, 1, 5):
            stream.metric(STREAM_STALENESS, staleness, 2, policy="main")
        for context in (trainer, producer, stream):
            context.producer.flush()
        # three processes' records: each arrives in its own order, so wait for all
        later = poll(
            url,
            lambda s: (
                total(s, "astraflow_stream_staleness_count") == 3
                and total(s, "astraflow_train_version") == 2
                and total(s, "astraflow_rollout_trajectories_total", producer=producer.instance) == 192
            ),
            60,
            alive,
        )
        assert total(later, "astraflow_train_version") == 2
        assert total(later, "astraflow_stream_staleness_bucket", le="1.0") == 2
        assert total(later, "astraflow_stream_staleness_sum") == 6
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=30)
        for context in (trainer, producer, stream):
            context.close()
    assert serve.returncode == 0, serve.stdout.read()


def test_serving_a_directory_that_is_no_run_is_a_clear_error(tmp_path: Path) -> None:
    from tests.exporters import ASTRAFLOW

    result = subprocess.run(
        [str(ASTRAFLOW), "metrics", "serve", str(tmp_path), "--port", "0"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "no config.yaml here" in result.stderr
