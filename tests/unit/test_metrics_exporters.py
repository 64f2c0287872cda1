"""What a run gives other tools: Prometheus series by the catalogue's kinds, TensorBoard scalars
read back by TensorBoard's own reader, and a checkpoint exported as a Hugging Face directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from astraflow.analysis.prometheus import RunMetrics, exposed_name
from astraflow.config import load_config
from astraflow.core.errors import ConfigError
from astraflow.core.metric_names import (
    EVAL_ACCURACY,
    LAUNCHER_RESTARTS,
    ROLLOUT_TRAJECTORIES,
    STREAM_GROUP_REWARD,
    TRAIN_LOSS,
    TRAIN_VERSION,
)
from astraflow.core.rundir import RunDir
from astraflow.infra.launch.monitor import RunMonitor
from astraflow.log import open_log
from astraflow.runtime.context import ComponentContext
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.records import Metric
from tests.exporters import read_scalars

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def metric(name: str, value: float, step: int = 0, component: str = "c", **labels: str) -> Metric:
    return Metric(component, name, value, step, 1_000, {"instance": f"{component}-1", **labels})


def scrape(metrics: RunMetrics) -> dict[tuple[str, frozenset], float]:
    """The exposition text of ``metrics``, parsed back: (sample name, labels) → value."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_series_are_counters_gauges_and_histograms_as_the_catalogue_says() -> None:
    metrics = RunMetrics("r1")
    for value in (64, 128):  # two producers, each counting its own trajectories
        metrics.observe(metric(ROLLOUT_TRAJECTORIES, value, component="rollout", policy="main"))
    metrics.observe(
        Metric("rollout", ROLLOUT_TRAJECTORIES, 32, 0, 1, {"instance": "rollout-2", "policy": "main", "region": "eu"})
    )
    for version in (0, 1, 2):
        metrics.observe(metric(TRAIN_VERSION, version, version, component="train", policy="main"))
    for reward in (0.0, 0.25, 0.3, 1.0):
        metrics.observe(metric(STREAM_GROUP_REWARD, reward, component="stream", policy="main"))
    metrics.observe(metric(LAUNCHER_RESTARTS, 1, component="launcher", child="train", kind="train"))
    metrics.observe(metric(LAUNCHER_RESTARTS, 2, component="launcher", child="rollout-0", kind="rollout"))
    samples = scrape(metrics)

    def labels(component: str, producer: str, policy: str = "main", **extra: str) -> frozenset:
        return frozenset({"run": "r1", "policy": policy, "component": component, "producer": producer, **extra}.items())

    name = exposed_name(ROLLOUT_TRAJECTORIES)
    assert name == "astraflow_rollout_trajectories"
    assert samples[(name + "_total", labels("rollout", "rollout-1"))] == 128  # the newest count of that process
    assert samples[(name + "_total", labels("rollout", "rollout-2"))] == 32
    assert samples[("astraflow_train_version", labels("train", "train-1"))] == 2
    reward = exposed_name(STREAM_GROUP_REWARD)
    assert samples[(reward + "_count", labels("stream", "stream-1"))] == 4
    assert samples[(reward + "_sum", labels("stream", "stream-1"))] == pytest.approx(1.55)
    assert samples[(reward + "_bucket", labels("stream", "stream-1") | {("le", "0.25")})] == 2
    assert samples[(reward + "_bucket", labels("stream", "stream-1") | {("le", "+Inf")})] == 4
    restarts = exposed_name(LAUNCHER_RESTARTS) + "_total"  # one series per child
    assert samples[(restarts, labels("launcher", "launcher-1", policy="", child="train"))] == 1
    assert samples[(restarts, labels("launcher", "launcher-1", policy="", child="rollout-0"))] == 2


def test_the_run_monitor_writes_each_metric_as_a_tensorboard_scalar_stepped_by_version(tmp_path: Path) -> None:
    config = load_config(EXAMPLES / "solver_verifier" / "config.yaml")
    topics = RunTopics(config.run, config.workflow, tuple(config.policy_names()))
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        topics.ensure(log, partitions=1)
        ctx = ComponentContext(config, tmp_path, "test")
        for version in (1, 2, 3):
            ctx.metric(TRAIN_VERSION, version, version, policy="solver")
            ctx.metric(TRAIN_LOSS, 0.5 / version, version, policy="solver")
        ctx.metric(TRAIN_VERSION, 7, 7, policy="verifier")
        ctx.metric(EVAL_ACCURACY, 0.625, 2, policy="solver")
        ctx.metric(LAUNCHER_RESTARTS, 1, 3, child="feed", kind="feed")
        ctx.close()
        monitor = RunMonitor(config, tmp_path, log, topics)
        monitor._consume(timeout=1.0)
        monitor.close()
    scalars = read_scalars(RunDir(tmp_path).tensorboard)
    assert scalars[f"{TRAIN_VERSION}/solver"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert scalars[f"{TRAIN_VERSION}/verifier"] == [(7, 7.0)]
    assert [step for step, _ in scalars[f"{TRAIN_LOSS}/solver"]] == [1, 2, 3]
    assert scalars[f"{TRAIN_LOSS}/solver"][2][1] == pytest.approx(0.5 / 3)
    assert scalars[f"{EVAL_ACCURACY}/solver"] == [(2, 0.625)]
    assert scalars[LAUNCHER_RESTARTS] == [(3, 1.0)]  # no policy label: the name alone


def test_a_checkpointed_version_exports_as_a_directory_plain_transformers_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.basemodel.tiny import TinyModelSpec, create_tiny_checkpoint
    from astraflow.engines.loading import load_policy
    from astraflow.training.checkpoint import CheckpointStore, TrainerState
    from astraflow.training.export import export_version

    config = load_config(EXAMPLES / "math" / "config.yaml")
    create_tiny_checkpoint(RunDir(tmp_path).base(), TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2))
    model, tokenizer = load_policy(RunDir(tmp_path).base())
    optimizer = torch.optim.AdamW(model.parameters())
    store = CheckpointStore(RunDir(tmp_path).checkpoints("main"))
    trained = {}
    for version in (3, 4):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 1e-3)
        store.save(model, optimizer, TrainerState(version, {0: version}, version))
        trained[version] = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    out = tmp_path / "v3"
    assert export_version(config, tmp_path, "main", out, version=3) == 3
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert exported.dtype == torch.float32
    for name, tensor in exported.state_dict().items():  # the trainer's weights as the run's readers got them
        assert torch.equal(tensor, trained[3][name].to(torch.bfloat16).float()), name
    assert not torch.equal(exported.state_dict()["lm_head.weight"], trained[4]["lm_head.weight"].float())
    assert AutoTokenizer.from_pretrained(out)("12+35=")["input_ids"] == tokenizer("12+35=")["input_ids"]
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"

    assert export_version(config, tmp_path, "main", tmp_path / "newest") == 4
    with pytest.raises(ConfigError, match=r"checkpoints of versions \[3, 4\] only"):
        export_version(config, tmp_path, "main", tmp_path / "v2", version=2)
    with pytest.raises(ConfigError, match="already exists"):
        export_version(config, tmp_path, "main", out, version=3)


def test_without_the_monitor_extra_each_exporter_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from astraflow.analysis.prometheus import serve
    from astraflow.analysis.tensorboard import TensorBoardWriter
    from astraflow.core.errors import MissingDependencyError
    from astraflow.runtime.attach import AttachedRun

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # what a missing package imports as
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MissingDependencyError, match=r"astraflow\[monitor\]"):
        TensorBoardWriter(tmp_path / "tensorboard", ["main"])
    config = load_config(EXAMPLES / "math" / "config.yaml")
    with open_log("embedded", path=tmp_path / "log.sqlite") as log:
        with pytest.raises(MissingDependencyError, match=r"scripts/setup.sh monitor"):
            serve(AttachedRun(config, tmp_path, log), 0, "127.0.0.1", threading.Event())
        monitor = RunMonitor(config, tmp_path, log, RunTopics(config.run, config.workflow, ("main",)))
        assert monitor.tensorboard is None and "astraflow[monitor]" in monitor.notes[-1]  # the run goes on
        monitor.close()
