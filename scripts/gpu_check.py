"""The checks that need a GPU, in a few minutes (``scripts/gpu-check.sh`` runs this; issue #24).

On one CUDA device, with one rank:

1. ``engine``: the torch engine on the tiny model samples the same greedy tokens on the GPU as on
   the CPU (fp32), and sampling runs.
2. ``backend torch`` / ``backend fsdp``: one GRPO step of each trainer backend on the tiny model on
   the GPU; the loss equals the CPU step's (torch backend, fp32: within 1e-4), the step is finite and
   moves the weights (fsdp computes in bf16 where the GPU has it, so it is only checked to move them).
3. ``qwen2-0.5b``: a Qwen2-0.5B-shaped model (494M parameters, random init, bf16 weights on the GPU)
   generates a batch (tokens/s) and takes one training step of the ``torch`` backend (fp32 master
   weights, AdamW; step seconds and peak memory).

It prints one table and writes the figures as JSON (``--out``). With ``--device cpu --small`` it runs
the same code on the CPU with a small model, so the script itself is tested where there is no GPU
(``tests/unit/test_gpu_check.py``); the figures mean something only on a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from astraflow.basemodel.tiny import build_char_tokenizer, build_tiny_model
from astraflow.engines.shapes import QWEN2_05B, SMALL_QWEN2, random_qwen2
from astraflow.engines.torch_engine import TorchEngine
from astraflow.training.learner import build_learner
from astraflow.training.step import PolicyStepConfig, random_examples

LOSS_TOLERANCE = 1e-4
"""How far the torch backend's fp32 loss on the GPU may be from the CPU's (kernels differ in order)."""


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tiny_step(backend: str, device: str) -> dict:
    """One step of ``backend`` on the tiny model on ``device``: loss, grad norm, the largest weight change."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer).to(device)
    before = {name: tensor.detach().float().cpu().clone() for name, tensor in model.state_dict().items()}
    learner = build_learner(backend, model, tokenizer.pad_token_id, PolicyStepConfig(lr=1e-3, lr_warmup_steps=0))
    stats = learner.step(random_examples(len(tokenizer), 8, 12, 16))
    after = {name: tensor.detach().float().cpu() for name, tensor in learner.backend.full_state().items()}
    moved = max(float((after[name] - before[name]).abs().max()) for name in before)
    return {"loss": stats.loss, "grad_norm": stats.grad_norm, "max_weight_change": moved}


def check_engine(device: str) -> dict:
    """Greedy tokens of the tiny model on ``device`` against the CPU's; a sampled batch runs."""
    tokenizer = build_char_tokenizer()
    prompts = ["12+34=", "7+8=", "99+1="]
    outputs = {}
    for where in dict.fromkeys(["cpu", device]):
        engine = TorchEngine(build_tiny_model(tokenizer).to(where), tokenizer, seed=0)
        contexts = engine.encode(prompts)
        greedy = engine.sample(contexts, n=1, max_new_tokens=16, temperature=1.0, greedy=True)
        outputs[where] = [turn.ids.tolist() for turn in greedy]
        sampled = engine.sample(contexts, n=4, max_new_tokens=16, temperature=1.0, greedy=False)
    return {"greedy_equal": outputs["cpu"] == outputs[device], "sampled": len(sampled)}


def qwen2_figures(device: str, small: bool, batch: int, new_tokens: int) -> dict:
    """Generation tokens/s and one torch-backend step of a Qwen2-0.5B-shaped model on ``device``."""
    shape = SMALL_QWEN2 if small else QWEN2_05B
    dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    model = random_qwen2(shape, max_positions=1024).to(device=device, dtype=dtype).eval()
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    ids = torch.randint(3, config.vocab_size, (batch, 64), device=device)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        synchronize(device)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, pad_token_id=0)
        synchronize(device)
        generate_s = time.perf_counter() - start
    generated = int((out.shape[1] - ids.shape[1]) * batch)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = random_qwen2(shape, max_positions=1024).to(device)  # fp32 master weights, as the trainer keeps them
    learner = build_learner("torch", model, 0, PolicyStepConfig(lr=1e-5, lr_warmup_steps=0, micro_batch_size=4))
    sizes = (16, 32) if small else (128, 256)
    batch_examples = random_examples(config.vocab_size, 8, *sizes)
    learner.step(batch_examples[:2])  # warm-up: kernels and AdamW's state
    synchronize(device)
    start = time.perf_counter()
    stats = learner.step(batch_examples)
    synchronize(device)
    step_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    return {
        "parameters": parameters,
        "generate_dtype": str(dtype).removeprefix("torch."),
        "generate_tokens_per_s": generated / generate_s,
        "generate_batch": batch,
        "step_s": step_s,
        "step_tokens": stats.tokens,
        "step_loss": stats.loss,
        "step_peak_gib": peak,
    }


def run_check(name: str, body: Callable[[], dict], rows: list[tuple[str, str, str]], results: dict) -> None:
    start = time.perf_counter()
    try:
        figures = body()
        verdict = figures.pop("ok", True)
    except Exception as exc:  # a check that fails is reported with the others, not the end of the script
        figures, verdict = {"error": f"{type(exc).__name__}: {exc}"}, False
    figures["seconds"] = round(time.perf_counter() - start, 2)
    results[name] = figures | {"ok": verdict}
    shown = ", ".join(
        f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}" for key, value in figures.items()
    )
    rows.append((name, "ok" if verdict else "FAILED", shown))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (the point of it) or cpu (to test the script)")
    parser.add_argument("--small", action="store_true", help="a small model instead of the 494M one")
    parser.add_argument("--batch", type=int, default=16, help="prompts per generation of the 494M model")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible; --device cpu --small tests the script itself", file=sys.stderr)
        return 2
    device = args.device
    results: dict = {}
    rows: list[tuple[str, str, str]] = []

    def engine() -> dict:
        figures = check_engine(device)
        return figures | {"ok": figures["greedy_equal"]}

    def backend_torch() -> dict:
        on_device, on_cpu = tiny_step("torch", device), tiny_step("torch", "cpu")
        difference = abs(on_device["loss"] - on_cpu["loss"])
        ok = difference <= LOSS_TOLERANCE and on_device["max_weight_change"] > 0
        return on_device | {"cpu_loss": on_cpu["loss"], "ok": ok}

    def backend_fsdp() -> dict:
        figures = tiny_step("fsdp", device)
        return figures | {"ok": bool(np.isfinite(figures["loss"])) and figures["max_weight_change"] > 0}

    run_check("engine", engine, rows, results)
    run_check("backend torch", backend_torch, rows, results)
    run_check("backend fsdp", backend_fsdp, rows, results)
    run_check(
        "qwen2-0.5b" if not args.small else "qwen2-small",
        lambda: qwen2_figures(device, args.small, args.batch, args.new_tokens),
        rows,
        results,
    )

    environment = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
    }
    print(f"\ngpu-check on {environment['device']} (python {environment['python']}, torch {environment['torch']})")
    width = max(len(name) for name, _, _ in rows)
    for name, verdict, shown in rows:
        print(f"  {name:<{width}}  {verdict:<6}  {shown}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"environment": environment, "checks": results}, indent=2) + "\n")
    return 0 if all(result["ok"] for result in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
