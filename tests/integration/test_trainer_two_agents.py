"""Two launcher agents on loopback train one policy as one FSDP2 trainer, and it trains as one rank does;
a trainer resumes under another world size (1 -> 2 -> 1 ranks).

Two ``astraflow train --nproc 1 --nnodes 2 --rdzv-endpoint 127.0.0.1:PORT`` processes, as on two
machines, meet through the c10d rendezvous and form a world of two: one holds rank 0 (which reads the
samples and writes the log), the other rank 1 (which writes nothing). They train the math example's
trainer on the fixed samples of ``test_trainer_reference.py``, whose single-rank losses and final
weights are committed (``golden/trainer_reference.json``): the two ranks must reproduce them within
fp32 rounding (losses to 1e-5 relative; per tensor, the sum and norm of the weights to 1e-5), every
sample must be trained once (the ledger's sample ids), and the run must stop cleanly on SIGTERM.

A trainer of one rank checkpoints full state dicts (``model.pt``), one of several ranks its shards
(``sharded/``, ``torch.distributed.checkpoint``): the FSDP2 run's final weights are read back from its
shards, and each kind resumes under the other world size: one batch of samples at a time, ``astraflow
train`` trains version 1 with one rank, 2 with two (DDP, a sharded checkpoint), 3 with one again, each
resuming from the checkpoint before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from astraflow.basemodel.tiny import TinyModelSpec, create_tiny_checkpoint
from astraflow.config import dump_config, load_config
from astraflow.infra.broker.local import free_port
from astraflow.log import open_log
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import LedgerEntry, Metric
from astraflow.training.checkpoint import is_sharded, read_model_state
from tests.unit.test_trainer_reference import REFERENCE, VERSIONS, recorded_samples

REPO = Path(__file__).resolve().parents[2]


def write_run(tmp_path: Path, backend: str, batches: int) -> tuple[Path, Path, int]:
    """The config (the reference's, with ``backend``) and run directory, with ``batches`` batches of
    samples on its log."""
    base = create_tiny_checkpoint(tmp_path / "base", TinyModelSpec(seed=11))
    overrides = {
        "mode": "async",
        "stream": {"max_staleness": 1_000_000},
        "model": {"path": str(base)},
        "train.backend": backend,
        "train.threads": 1,
    }
    config = load_config(REPO / "examples" / "math" / "config.yaml", overrides)
    dump_config(config, tmp_path / "config.yaml")
    count = batches * config.train.batch_samples
    add_samples(tmp_path / "config.yaml", tmp_path / "run", recorded_samples(count))
    return tmp_path / "config.yaml", tmp_path / "run", count


def add_samples(config: Path, run_dir: Path, samples: list) -> None:
    ctx = ComponentContext(load_config(config), run_dir, "test")
    for sample in samples:
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=sample.trajectory.group_id.encode())
    ctx.producer.flush()
    ctx.close()


def trained_version(run_dir: Path) -> int:
    """The newest version of a ``step`` entry in the ledger (0 before any)."""
    if not (run_dir / "log.sqlite").exists():
        return 0
    return max((entry.version for entry in ledger(run_dir) if entry.kind == "step"), default=0)


def train_until(tmp_path: Path, version: int, *options: str, name: str = "agent") -> str:
    """Run ``astraflow train`` with ``options`` (one process per entry of ``options``, a tuple each) until
    the ledger holds ``version``, then SIGTERM every process; their output. Each must exit 0."""
    commands = [
        [
            sys.executable,
            "-m",
            "astraflow.cli",
            "train",
            str(tmp_path / "config.yaml"),
            "--run-dir",
            str(tmp_path / "run"),
        ]
        + list(extra)
        for extra in options
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    paths = [tmp_path / f"{name}{n}.out" for n in range(len(commands))]
    outputs = [path.open("wb") for path in paths]
    agents = [
        subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        for command, out in zip(commands, outputs)
    ]
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and all(agent.poll() is None for agent in agents):
            if trained_version(tmp_path / "run") >= version:
                break
            time.sleep(1.0)
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        codes = [agent.wait(timeout=120) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
        for out in outputs:
            out.close()
    logs = "\n".join(path.read_text(errors="replace") for path in paths)
    assert codes == [0] * len(agents), logs[-6000:]
    assert trained_version(tmp_path / "run") >= version, logs[-6000:]
    return logs


def ledger(run_dir: Path) -> list[LedgerEntry]:
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        return [record for _, record in decode_snapshot(log, "math.ledger.main") if isinstance(record, LedgerEntry)]


def test_two_agents_on_loopback_train_one_policy_like_one_rank(tmp_path: Path) -> None:
    _, run_dir, count = write_run(tmp_path, "fsdp", VERSIONS)
    agent = ("--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    logs = train_until(tmp_path, VERSIONS, agent, agent)
    assert "rank 1: restored the base" in logs and "trainer backend fsdp, 2 ranks" in logs, logs[-6000:]
    entries = [entry for entry in ledger(run_dir) if entry.kind == "step"]
    assert [entry.version for entry in entries] == list(range(1, VERSIONS + 1)), logs[-6000:]
    trained = [sample_id for entry in entries for sample_id in entry.sample_ids]
    assert sorted(trained) == sorted(sample.sample_id for sample in recorded_samples(count))  # each once
    reference = json.loads(REFERENCE.read_text())
    with open_log("embedded", path=run_dir / "log.sqlite") as log:
        metrics = [record for _, record in decode_snapshot(log, "math.metrics.trainer") if isinstance(record, Metric)]
    losses = [m.value for m in sorted(metrics, key=lambda m: m.step) if m.name == "train.loss"]
    np.testing.assert_allclose(losses, reference["losses"], rtol=1e-5, atol=1e-6)
    final = run_dir / "checkpoints" / "main" / f"v{VERSIONS:08d}"
    assert is_sharded(final) and not (final / "model.pt").exists()  # each rank wrote its own shards
    weights = read_model_state(final)
    assert weights.keys() == reference["final_sum_norm"].keys()
    for name, figures in reference["final_sum_norm"].items():
        tensor = weights[name].double()
        np.testing.assert_allclose([float(tensor.sum()), float(tensor.norm())], figures, rtol=1e-5, atol=1e-5)


def test_a_trainer_resumes_under_another_world_size(tmp_path: Path) -> None:
    config, run_dir, batch = write_run(tmp_path, "torch", 1)
    samples = recorded_samples(3 * batch)
    train_until(tmp_path, 1, ("--nproc", "1"), name="one")
    add_samples(config, run_dir, samples[batch : 2 * batch])
    two = train_until(tmp_path, 2, ("--nproc", "2"), name="two")
    assert "rank 1: restored" in two and "v00000001, training from version 1" in two, two[-6000:]
    add_samples(config, run_dir, samples[2 * batch :])
    checkpoints = run_dir / "checkpoints" / "main"
    assert (checkpoints / "v00000001" / "model.pt").is_file() and is_sharded(checkpoints / "v00000002")
    one = train_until(tmp_path, 3, ("--nproc", "1"), name="again")
    assert "resumed main at version 2" in one, one[-6000:]
    entries = ledger(run_dir)
    steps = [entry for entry in entries if entry.kind == "step"]
    assert [entry.version for entry in steps] == [1, 2, 3]
    assert [entry.epoch for entry in steps] == [1, 2, 3]  # one trainer epoch per start (the first is 1)
    assert sorted(i for entry in steps for i in entry.sample_ids) == sorted(s.sample_id for s in samples)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie no one reaps counts: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_ranks_stop_when_their_launcher_agent_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the ``astraflow train`` agent, which cannot pass a stop on: its ranks stop by themselves
    (the kernel's SIGTERM on the death of their parent), rank 0 after checkpointing its version."""
    config, run_dir, _ = write_run(tmp_path, "torch", 2)
    command = [sys.executable, "-m", "astraflow.cli", "train", str(config), "--run-dir", str(run_dir), "--nproc", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with (tmp_path / "agent.out").open("wb") as out:
        agent = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 400
        while trained_version(run_dir) < 1 and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
        logs = (tmp_path / "agent.out").read_text(errors="replace")
        assert agent.poll() is None and trained_version(run_dir) >= 1, logs[-6000:]
        ranks += [int(path.stem.rsplit("-", 1)[1]) for path in (run_dir / "logs").glob("train-*.log")]
        assert len(ranks) == 2, ranks
        agent.kill()
        agent.wait(timeout=30)
        deadline = time.monotonic() + 120
        while not all(gone(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.5)
        logs = (tmp_path / "agent.out").read_text(errors="replace")
        assert all(gone(pid) for pid in ranks), logs[-6000:]
    finally:
        if agent.poll() is None:
            agent.kill()
        for pid in ranks:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    rank0 = next((run_dir / "logs").glob("train-[0-9]*.log")).read_text()
    assert "received signal 15" in rank0, rank0[-3000:]
