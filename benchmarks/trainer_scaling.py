"""A trainer of several ranks: what each rank holds, and what a second rank buys on this machine (issue #24).

1. ``bytes``: on a Qwen2-0.5B-shaped model (494M parameters, random init, fp32 as the trainer keeps
   its master weights), one GRPO step of the ``torch`` backend (DDP with two ranks) and of ``fsdp``
   (FSDP2) at one and two ranks, under ``torch.distributed.run`` on gloo; then each rank sums the
   bytes of what it holds, from its local shards: parameters, gradients and AdamW's state. Sharding
   should make FSDP2's per-rank bytes at two ranks about half of DDP's. ``deepspeed`` at ZeRO stage
   3 likewise, counted from ZeRO's own partitions: each parameter's ``ds_tensor``, the flat gradient
   partition, and as optimizer state the AdamW moments *and* the fp32 master partition ZeRO keeps
   beside the parameters even when they are fp32 themselves (its communication buckets are not
   counted); and ZeRO-3 in DeepSpeed's bf16 mode (``train.deepspeed.mixed_precision: bf16``, what
   ``auto`` is on a GPU with bf16): bf16 weight partitions, the fp32 master and AdamW's moments.
2. ``samples_per_s``: the tiny model's trainer (``torch`` backend) at one and two ranks on the same
   batches, three rounds alternating which goes first, on the same cores: one rank of
   ``CORES`` threads against two ranks of ``CORES / 2`` threads each. On two CPU cores a second rank
   adds no compute, only DDP's all-reduce and a second process; what it can gain is what one
   process's intra-op threads leave idle on a small model.

Writes ``benchmarks/results/trainer_scaling.json`` (with its provenance: ``provenance.py``) and
``trainer_scaling.png``.

    .venv/bin/python benchmarks/trainer_scaling.py [--small]

``--small`` replaces the 494M model by a small one of the same architecture (a quick try of the script).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TINY_BATCH = 64
"""Samples per step of the samples/s measurement (the math example's batch is 512 of the tiny model)."""
TINY_STEPS = 8
CORES = 2
"""Threads of the one-rank run, shared out between the ranks of the two-rank run."""


def local_bytes(tensor) -> int:
    """Bytes of this rank's part of ``tensor`` (a DTensor's local shard, else the tensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


BACKENDS = {"ddp": "torch", "fsdp2": "fsdp", "zero3": "deepspeed3", "zero3bf16": "deepspeed3bf16"}
"""Name in the results → ``--rank-bytes`` backend (``deepspeed3``: ``deepspeed`` at ZeRO stage 3;
``deepspeed3bf16``: the same in DeepSpeed's bf16 mode, ``train.deepspeed.mixed_precision: bf16``)."""


def zero3_bytes(backend, torch) -> dict:
    """This rank's bytes under ZeRO-3, from DeepSpeed's partitions (the parameters' own tensors are empty)."""
    zero = backend.engine.optimizer

    def size(tensor) -> int:
        return tensor.numel() * tensor.element_size()

    master = sum(size(flat) for flat in zero.fp32_partitioned_groups_flat)
    moments = sum(
        size(value)
        for state in zero.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )
    return {
        "parameters": sum(size(p.ds_tensor) for p in backend.model.parameters()),
        "gradients": size(zero.grad_partitions_flat_buffer),
        "optimizer": master + moments,
        "master_weights": master,
    }


def rank_bytes(backend: str, small: bool, out: Path) -> None:
    """In a rank: one step of ``backend`` on the Qwen2-shaped model, then this rank's bytes into ``out``."""
    import torch

    from astraflow.config.train import DeepSpeedOptions
    from astraflow.engines.shapes import QWEN2_05B, SMALL_QWEN2, random_qwen2
    from astraflow.training.distributed import Ranks, init_group
    from astraflow.training.learner import build_learner
    from astraflow.training.step import PolicyStepConfig, random_examples

    torch.set_num_threads(1)
    ranks = Ranks.from_env()
    if ranks.distributed:
        init_group(ranks)
    model = random_qwen2(SMALL_QWEN2 if small else QWEN2_05B)
    config = model.config
    step = PolicyStepConfig(lr=1e-5, lr_warmup_steps=0)
    deepspeed = None
    if backend.startswith("deepspeed3"):
        precision = "bf16" if backend.endswith("bf16") else "off"
        deepspeed = DeepSpeedOptions(zero_stage=3, mixed_precision=precision)
    name = "deepspeed" if deepspeed else backend
    learner = build_learner(name, model, 0, step, ranks=ranks, deepspeed=deepspeed)
    learner.step(random_examples(config.vocab_size, 2 * ranks.world_size, 8, 8))
    if deepspeed:
        held = zero3_bytes(learner.backend, torch)
        held["total"] = held["parameters"] + held["gradients"] + held["optimizer"]
        numel = sum(p.ds_numel for p in model.parameters())
        out.write_text(json.dumps({"rank": ranks.rank, "world_size": ranks.world_size, "numel": numel, **held}))
        return
    module = learner.backend.model
    optimizer = learner.backend.sharded_parts()[1]
    held = {
        "parameters": sum(local_bytes(p) for p in module.parameters()),
        "gradients": sum(local_bytes(p.grad) for p in module.parameters() if p.grad is not None),
        "optimizer": sum(
            local_bytes(value)
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0
        ),
    }
    held["total"] = sum(held.values())
    numel = sum(p.numel() for p in model.parameters())
    out.write_text(json.dumps({"rank": ranks.rank, "world_size": ranks.world_size, "numel": numel, **held}))


def launch(ranks: int, arguments: list[str], timeout: int = 1800) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone"]
    command += [__file__, *arguments]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def measure_bytes(small: bool, work: Path) -> dict:
    """Per rank bytes of DDP (``torch``), FSDP2 (``fsdp``) and ZeRO-3 at one and two ranks."""
    measured: dict = {}
    for name, backend in BACKENDS.items():
        for world in (1, 2):
            folder = work / f"{name}-{world}"
            folder.mkdir()
            launch(world, ["--rank-bytes", backend, "--out", str(folder)] + (["--small"] if small else []))
            rows = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world)]
            measured[f"{name}-{world}"] = rows
            print(f"{name} x{world}: {[row['total'] / 2**30 for row in rows]} GiB per rank", flush=True)
    return measured


def rank_rate(steps: int, out: Path) -> None:
    """In a rank: samples/s of the tiny model's ``torch`` trainer over ``steps`` steps (after one warm-up)."""
    import torch

    from astraflow.basemodel.tiny import build_char_tokenizer, build_tiny_model
    from astraflow.training.distributed import Ranks, all_reduce_sum, init_group
    from astraflow.training.learner import build_learner
    from astraflow.training.step import PolicyStepConfig, random_examples

    ranks = Ranks.from_env()
    torch.set_num_threads(max(1, CORES // ranks.world_size))
    if ranks.distributed:
        init_group(ranks)
    tokenizer = build_char_tokenizer()
    learner = build_learner(
        "torch", build_tiny_model(tokenizer), tokenizer.pad_token_id, PolicyStepConfig(lr=1e-4), ranks=ranks
    )
    batches = [random_examples(len(tokenizer), TINY_BATCH, 12, 16, seed=step) for step in range(steps + 1)]
    learner.step(batches[0])
    all_reduce_sum([0.0], ranks)  # every rank starts the clock together
    start = time.perf_counter()
    for batch in batches[1:]:
        learner.step(batch)
    seconds = time.perf_counter() - start
    if ranks.leader:
        out.write_text(json.dumps({"world_size": ranks.world_size, "samples_per_s": steps * TINY_BATCH / seconds}))


def measure_rates(work: Path, rounds: int = 3) -> dict:
    rates: dict[str, list[float]] = {"1": [], "2": []}
    for round_ in range(rounds):
        for world in (1, 2) if round_ % 2 == 0 else (2, 1):
            out = work / f"rate-{round_}-{world}.json"
            launch(world, ["--rank-rate", str(TINY_STEPS), "--out", str(out)], timeout=900)
            rates[str(world)].append(json.loads(out.read_text())["samples_per_s"])
            print(f"tiny x{world}: {rates[str(world)][-1]:.1f} samples/s", flush=True)
    return rates


def summarize(measured: dict, rates: dict) -> dict:
    per_rank = {name: max(row["total"] for row in rows) for name, rows in measured.items()}
    return {
        "per_rank_gib": {name: value / 2**30 for name, value in per_rank.items()},
        "fsdp2_2_over_ddp_2": per_rank["fsdp2-2"] / per_rank["ddp-2"],
        "fsdp2_2_over_fsdp2_1": per_rank["fsdp2-2"] / per_rank["fsdp2-1"],
        "ddp_2_over_ddp_1": per_rank["ddp-2"] / per_rank["ddp-1"],
        "zero3_2_over_ddp_2": per_rank["zero3-2"] / per_rank["ddp-2"],
        "zero3_2_over_zero3_1": per_rank["zero3-2"] / per_rank["zero3-1"],
        "zero3bf16_2_over_ddp_2": per_rank["zero3bf16-2"] / per_rank["ddp-2"],
        "zero3bf16_2_over_zero3bf16_1": per_rank["zero3bf16-2"] / per_rank["zero3bf16-1"],
        "samples_per_s_median": {world: statistics.median(values) for world, values in rates.items()},
        "two_over_one_ranks": statistics.median(rates["2"]) / statistics.median(rates["1"]),
    }


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(summary["per_rank_gib"])
    colors = {"ddp": "#888", "fsdp2": "#48c", "zero3": "#c84", "zero3bf16": "#e2a65a"}
    left.bar(names, [summary["per_rank_gib"][name] for name in names], color=[colors[n.split("-")[0]] for n in names])
    left.set_ylabel("GiB per rank (parameters + gradients + AdamW)")
    left.set_title("Qwen2-0.5B-shaped (zero3bf16: bf16 weights, fp32 master)")
    left.tick_params(axis="x", labelrotation=45)
    worlds = list(summary["samples_per_s_median"])
    right.bar([f"{w} rank(s)" for w in worlds], [summary["samples_per_s_median"][w] for w in worlds], color="#6a6")
    right.set_ylabel("samples/s (median of 3)")
    right.set_title(f"tiny model, torch backend, {CORES} threads in all")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--rank-bytes", choices=sorted(BACKENDS.values()), help=argparse.SUPPRESS)
    parser.add_argument("--rank-rate", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_bytes:
        rank = int(os.environ.get("RANK", "0"))
        return rank_bytes(args.rank_bytes, args.small, args.out / f"rank{rank}.json")
    if args.rank_rate:
        return rank_rate(args.rank_rate, args.out)
    record = begin()  # no config file: the model and batches are in this script
    with tempfile.TemporaryDirectory() as work:
        measured = measure_bytes(args.small, Path(work))
        rates = measure_rates(Path(work))
    summary = summarize(measured, rates)
    result = {
        "inputs": {
            "model": "small" if args.small else "qwen2-0.5b-shaped",
            "tiny_batch": TINY_BATCH,
            "tiny_steps": TINY_STEPS,
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "measured": measured,
        "rates": rates,
        "summary": summary,
        "provenance": finish(record),
    }
    name = "trainer_scaling_small" if args.small else "trainer_scaling"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(summary, RESULTS / f"{name}.png")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
