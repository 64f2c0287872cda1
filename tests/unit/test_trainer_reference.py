"""The math example's trainer, fed fixed samples, reproduces committed losses and weights bit for bit.

The reference (``golden/trainer_reference.json``) was recorded before the package layout moved
("Layers I"): a refactor that changes what the trainer computes fails here. The samples are made
from a fixed seed with numpy alone (real arithmetic prompts in the tiny model's characters, random
responses and behaviour log-probs, GRPO advantages of random 0/1 rewards) and go through the real
path: Avro on the embedded log, the ``Trainer`` component built from ``examples/math/config.yaml``.

Floating-point kernels differ between CPU instruction sets, so losses and weights are compared bit
for bit where torch reports the capability the reference was recorded on, and to 1e-5 elsewhere.
Set ``ASTRAFLOW_RECORD_REFERENCE=1`` to write the reference instead of checking it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, create_tiny_checkpoint
from astraflow.config import load_config
from astraflow.consumers.trainer.component import Trainer
from astraflow.runtime.attach import decode_snapshot
from astraflow.runtime.context import ComponentContext
from astraflow.schemas.records import TrainSample, Trajectory

REPO = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parent / "golden" / "trainer_reference.json"
VERSIONS = 4
GROUP = 8


def recorded_samples(count: int, seed: int = 7) -> list[TrainSample]:
    """``count`` samples in groups of ``GROUP``: a fixed function of ``seed``."""
    rng = np.random.default_rng(seed)
    tokenizer = build_char_tokenizer()
    samples = []
    for group in range(count // GROUP):
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        prompt = np.asarray(tokenizer.encode(f"{a}+{b}="), dtype=np.int32)
        rewards = rng.integers(0, 2, size=GROUP).astype(np.float64)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for member in range(GROUP):
            length = int(rng.integers(1, 5))
            response = np.append(rng.integers(3, 13, size=length - 1), tokenizer.eos_token_id).astype(np.int32)
            trajectory = Trajectory(
                trajectory_id=f"g{group}/{member}",
                episode_id=f"g{group}/{member}",
                group_id=f"g{group}",
                task_id=f"g{group}",
                prompt_id=f"p{group}",
                policy="main",
                workflow="math",
                prompt_ids=prompt,
                response_ids=response,
                behaviour_logprobs=rng.uniform(-3.0, -0.1, size=length).astype(np.float32),
                token_versions=np.zeros(length, dtype=np.int32),
                loss_mask=np.ones(length, dtype=np.uint8),
                reward=float(rewards[member]),
                reward_components={"correct": float(rewards[member])},
                response_text="",
                group_size=GROUP,
                producer_id="recorded",
                created_ms=1,
            )
            samples.append(
                TrainSample(f"s{group}/{member}", trajectory, float(advantages[member]), 0, ["grpo"], created_ms=1)
            )
    return samples


def weights_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def train_reference(tmp_path: Path) -> dict[str, object]:
    """Train ``VERSIONS`` versions of the math example's trainer on the recorded samples."""
    base = create_tiny_checkpoint(tmp_path / "base", TinyModelSpec(seed=11))
    # the recorded samples are all of version 0: no staleness bound, as for a replay
    overrides = {"mode": "async", "stream": {"max_staleness": 1_000_000}, "model": {"path": str(base)}}
    config = load_config(REPO / "examples" / "math" / "config.yaml", overrides)
    ctx = ComponentContext(config, tmp_path / "run", "train")
    for sample in recorded_samples(VERSIONS * config.train.batch_samples):
        ctx.producer.send(ctx.topics.samples("main"), ctx.codec.encode(sample), key=sample.trajectory.group_id.encode())
    ctx.producer.flush()
    trainer = Trainer(ctx, "main")
    stop, digests = threading.Event(), []
    step = trainer._step

    def step_then_stop_at_the_last_version(*args: object) -> None:
        step(*args)
        digests.append(weights_sha256(trainer.learner.model))
        if trainer.learner.version >= VERSIONS:
            stop.set()

    trainer._step = step_then_stop_at_the_last_version
    try:
        trainer.run(stop)
        metrics = [record for _, record in decode_snapshot(ctx.log, ctx.topics.metrics(ctx.role))]
    finally:
        ctx.close()
    losses = [m.value for m in sorted(metrics, key=lambda m: m.step) if m.name == "train.loss"]
    norms = {
        name: [float(t.double().sum()), float(t.double().norm())]
        for name, t in trainer.learner.model.state_dict().items()
    }
    return {"losses": losses, "weights_sha256": digests, "final_sum_norm": norms}


def test_the_trainer_reproduces_the_recorded_losses_and_weights(tmp_path: Path) -> None:
    result = train_reference(tmp_path)
    capability = torch.backends.cpu.get_cpu_capability()
    if os.environ.get("ASTRAFLOW_RECORD_REFERENCE") == "1":
        REFERENCE.write_text(json.dumps({"cpu_capability": capability, "torch": torch.__version__, **result}, indent=1))
        pytest.skip("reference written")
    reference = json.loads(REFERENCE.read_text())
    assert len(result["losses"]) == VERSIONS
    if capability == reference["cpu_capability"] and torch.__version__ == reference["torch"]:
        assert result["losses"] == reference["losses"]
        assert result["weights_sha256"] == reference["weights_sha256"]
    else:
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5, atol=1e-6)
    assert result["final_sum_norm"].keys() == reference["final_sum_norm"].keys()
    for name, figures in reference["final_sum_norm"].items():
        np.testing.assert_allclose(result["final_sum_norm"][name], figures, rtol=1e-5, atol=1e-5, err_msg=name)
