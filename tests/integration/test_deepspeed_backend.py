"""The DeepSpeed trainer backend on CPU (gloo, one process) trains like the torch backend.

Same tiny model, same seed, same batches: ZeRO 0/1/2 (and 2 with the optimizer offloaded to
DeepSpeedCPUAdam) give the torch backend's loss, gradient norm and weights step for step, and a
checkpoint taken mid-way (DeepSpeed's own format, loaded back through its universal conversion, as
the trainer does) restores model *and* optimizer (Adam moments), so the resumed steps match the
uninterrupted ones.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("deepspeed", reason="needs deepspeed: scripts/setup.sh test deepspeed")

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.config import parse_config
from astraflow.engines.torch_engine import TorchEngine
from astraflow.training.checkpoint import CheckpointStore, TrainerState
from astraflow.training.learner import build_learner
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer

SPEC = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3)
STEP = PolicyStepConfig(lr=1e-2, lr_warmup_steps=0, lr_decay_steps=0, max_grad_norm=0.5, micro_batch_size=5)
STEPS = 4


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, SPEC)
    engine = TorchEngine(copy.deepcopy(model), tokenizer, seed=0)
    rng = np.random.default_rng(0)
    batches = []
    for step in range(STEPS):
        groups = engine.generate([f"{step}+{k}=" for k in range(3)], n=4, max_new_tokens=5, temperature=1.0)
        batches.append(
            [
                PolicyExample(
                    g.prompt_ids,
                    g.response_ids,
                    g.logprobs,
                    np.ones(len(g.response_ids), np.uint8),
                    float(rng.normal()),
                )
                for group in groups
                for g in group
            ]
        )
    return tokenizer, model, batches


def _trainer(
    name: str, model, pad_id: int, stage: int = 2, offload: bool = False, precision: str = "auto"
) -> PolicyTrainer:
    deepspeed = {"zero_stage": stage, "offload_optimizer": offload, "mixed_precision": precision}
    options = parse_config({"train": {"backend": name, "deepspeed": deepspeed}}).train.deepspeed
    return build_learner(name, model, pad_id, STEP, deepspeed=options)


def _run(trainer: PolicyTrainer, batches) -> list[float]:
    """Loss and gradient norm of each step, flat: [loss_1, norm_1, loss_2, ...]."""
    return [figure for stats in map(trainer.step, batches) for figure in (stats.loss, stats.grad_norm)]


@pytest.mark.parametrize(("stage", "offload"), [(0, False), (1, False), (2, False), (2, True)])
def test_zero_trains_like_torch(setup, stage: int, offload: bool) -> None:
    tokenizer, model, batches = setup
    reference = _trainer("torch", copy.deepcopy(model), tokenizer.pad_token_id)
    zero = _trainer("deepspeed", copy.deepcopy(model), tokenizer.pad_token_id, stage, offload)
    expected, got = _run(reference, batches), _run(zero, batches)
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert len({round(loss, 6) for loss in expected[::2]}) == STEPS  # the weights really moved between steps
    for name, tensor in reference.model.state_dict().items():
        torch.testing.assert_close(zero.model.state_dict()[name], tensor, atol=2e-5, rtol=1e-4, msg=name)


def test_zero3_in_bf16_keeps_bf16_weights_and_an_fp32_master_and_trains_like_torch(setup) -> None:
    """``mixed_precision: bf16`` (what ``auto`` is on a GPU with bf16), here on the CPU: the engine's weights
    are bf16, ZeRO's master partition fp32, and the steps follow fp32 torch within bf16's precision."""
    tokenizer, model, batches = setup
    reference = _trainer("torch", copy.deepcopy(model), tokenizer.pad_token_id)
    zero = _trainer("deepspeed", copy.deepcopy(model), tokenizer.pad_token_id, 3, precision="bf16")
    assert {p.ds_tensor.dtype for p in zero.backend.model.parameters()} == {torch.bfloat16}
    assert {flat.dtype for flat in zero.backend.engine.optimizer.fp32_partitioned_groups_flat} == {torch.float32}
    expected, got = _run(reference, batches), _run(zero, batches)
    assert got[::2] == pytest.approx(expected[::2], rel=0.05, abs=1e-3)  # losses, within bf16's ~3 digits
    full = dict(zero.backend.full_state().items())
    moved = [name for name, tensor in model.state_dict().items() if not torch.equal(full[name].float(), tensor)]
    assert moved, "no weight changed"


def test_zero2_checkpoint_round_trip(setup, tmp_path: Path) -> None:
    tokenizer, model, batches = setup
    pad = tokenizer.pad_token_id
    straight = _trainer("deepspeed", copy.deepcopy(model), pad)
    expected = _run(straight, batches)

    first = _trainer("deepspeed", copy.deepcopy(model), pad)
    _run(first, batches[:2])
    store = CheckpointStore(tmp_path / "ckpt")
    assert first.backend.checkpoints_sharded  # the trainer's path: DeepSpeed's format, one rank or several
    tmp = store.begin(first.version)
    first.backend.save_shards(tmp)
    store.commit(tmp, TrainerState(first.version, {0: 24}, 24))

    resumed = _trainer("deepspeed", build_tiny_model(tokenizer, TinyModelSpec(**{**SPEC.__dict__, "seed": 99})), pad)
    state = resumed.backend.load_shards(store.find())  # through the universal conversion
    assert (state.version, state.offsets) == (2, {0: 24})
    assert not (tmp_path / "ckpt" / "universal.tmp").exists()  # the scratch conversion is removed
    resumed.version = state.version
    assert _run(resumed, batches[2:]) == pytest.approx(expected[4:], rel=1e-4, abs=1e-6)
    for name, tensor in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor, atol=2e-5, rtol=1e-4, msg=name)
