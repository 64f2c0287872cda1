"""``scripts/gpu_check.py`` runs where there is no GPU: the same checks on the CPU with a small model
(``--device cpu --small``) pass and write their figures, so a lent GPU machine's few minutes are not
spent on a broken script; asked for CUDA where there is none, it says so and exits 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_checks_pass_on_the_cpu_with_a_small_model(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    code = load_script().main(["--device", "cpu", "--small", "--batch", "2", "--new-tokens", "8", "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0, report
    assert set(report["checks"]) == {"engine", "backend torch", "backend fsdp", "qwen2-small"}
    assert all(check["ok"] for check in report["checks"].values()), report
    assert report["checks"]["backend torch"]["max_weight_change"] > 0
    assert report["checks"]["qwen2-small"]["generate_tokens_per_s"] > 0


def test_asked_for_cuda_without_a_gpu_it_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: scripts/gpu-check.sh runs the checks for real")
    assert load_script().main(["--device", "cuda"]) == 2
