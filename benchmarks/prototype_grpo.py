"""Single-process GRPO prototype on 2-digit addition: warm-up, then RL, timing held-out EM.

No log, no processes: the tiny model, the engine, the reward, the GRPO advantage and the PPO step
run in one loop, the compute the async system spreads over its producer and trainer processes.
Each step samples ``prompts`` train problems ``group`` times, scores them by exact match, drops
zero-variance groups (DAPO dynamic sampling, counted) and takes one optimizer step on the rest.
Held-out greedy EM is measured every ``eval_every`` steps; evaluation time is left out of the RL
clock (the async system's evaluator runs elsewhere) and reported apart.

    .venv/bin/python benchmarks/prototype_grpo.py                               # warm-up + tuned
    .venv/bin/python benchmarks/prototype_grpo.py --reuse-base --variants all   # the sweep, same base

Writes ``benchmarks/results/prototype_grpo.json`` (inputs, machine, curves, provenance: ``provenance.py``)
and a PNG of EM vs time.

Measured (2 threads, machine shared with other work): warm-up 210 steps of 64 at lr 1e-3, 16.8 s,
to EM 0.300; then ``TUNED`` (64 prompts x 8, lr 3e-4, 30 warm-up steps, cosine to 3e-5 over 300
steps, T = 1) reaches 0.902 at step 320, 143.7 s of RL (69 ms sampling + 380 ms training per step),
160.5 s in all. What mattered: the warm-up lr (3e-3 needs 7x the steps and leaves a base RL barely
moves), an lr warm-up (a fresh AdamW's first step at 2e-3 takes EM 0.33 -> 0.05), lr <= 3e-4 (higher
collapses to confidently wrong answers), and decaying the lr (at a constant lr greedy EM oscillates
around 0.85 and does not settle above 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from astraflow.basemodel.sft import supervised_warmup
from astraflow.basemodel.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
from astraflow.engines.loading import load_policy, save_policy
from astraflow.engines.torch_engine import TorchEngine
from astraflow.episodes.heldout import evaluate_exact_match
from astraflow.streams.operators.advantage import grpo_advantages, is_zero_variance
from astraflow.tasks.arithmetic import addition_problems, exact_match_reward
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer
from provenance import begin, finish

RESULTS = Path(__file__).parent / "results"
ALPHABET = "0123456789+="


@dataclass(frozen=True)
class GrpoConfig:
    """One RL variant."""

    prompts: int = 64
    group: int = 8
    lr: float = 3e-4
    warmup_steps: int = 30
    decay_steps: int = 300
    betas: tuple[float, float] = (0.9, 0.99)
    temperature: float = 1.0
    max_new_tokens: int = 4


TUNED = GrpoConfig()
VARIANTS: dict[str, GrpoConfig] = {  # the sweep recorded in results/prototype_grpo.json, all from one base
    "tuned": TUNED,
    "warmup10": replace(TUNED, warmup_steps=10),
    "lr2e-4-decay400": replace(TUNED, lr=2e-4, warmup_steps=10, decay_steps=400),
    "lr5e-4-warmup30": replace(TUNED, lr=5e-4),
    "t0.8": replace(TUNED, warmup_steps=10, temperature=0.8),
    "decay200": replace(TUNED, decay_steps=200),
    "p32": replace(TUNED, prompts=32),
    "p32-decay200": replace(TUNED, prompts=32, decay_steps=200),
}


def warm_up(args: argparse.Namespace, train: list, heldout: list) -> tuple[Path, dict]:
    """Supervised warm-up of a fresh tiny model to ``args.warmup_target`` held-out EM; saved to disk."""
    spec = TinyModelSpec(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=4 * args.hidden,
        seed=args.seed,
    )
    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_model(tokenizer, spec)
    result = supervised_warmup(
        model,
        tokenizer,
        train,
        heldout,
        target_em=args.warmup_target,
        max_steps=args.warmup_max_steps,
        batch_size=args.warmup_batch,
        lr=args.warmup_lr,
        eval_every=args.warmup_eval_every,
        seed=args.seed,
    )
    print(f"warm-up: {result.steps} steps, {result.seconds:.1f}s, held-out EM {result.heldout_em:.3f}")
    base = save_policy(model, tokenizer, args.base)
    return base, {
        "spec": asdict(spec),
        "steps": result.steps,
        "seconds": result.seconds,
        "heldout_em": result.heldout_em,
        "curve": result.curve,
        "lr": args.warmup_lr,
        "batch_size": args.warmup_batch,
        "target": args.warmup_target,
    }


def run_grpo(name: str, config: GrpoConfig, base: Path, train: list, heldout: list, args: argparse.Namespace) -> dict:
    """GRPO from the base checkpoint until held-out EM ≥ ``args.target`` or the time budget is spent."""
    model, tokenizer = load_policy(base)
    engine = TorchEngine(model, tokenizer, seed=args.seed)
    trainer = PolicyTrainer(
        model,
        tokenizer.pad_token_id,
        PolicyStepConfig(
            lr=config.lr,
            lr_warmup_steps=config.warmup_steps,
            lr_decay_steps=config.decay_steps,
            betas=config.betas,
            temperature=config.temperature,
        ),
    )
    rng = random.Random(args.seed)
    em = evaluate_exact_match(model, tokenizer, heldout)
    curve = [{"step": 0, "seconds": 0.0, "cpu_seconds": 0.0, "heldout_em": em}]
    clock = cpu = sample_s = train_s = 0.0
    dropped = kept = 0
    step_seconds: list[float] = []
    step = 0
    while em < args.target and clock < args.max_seconds:
        started, cpu_started = time.perf_counter(), time.process_time()
        problems = rng.sample(train, config.prompts)
        groups = engine.generate(
            [p.prompt for p in problems],
            n=config.group,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
        )
        sampled = time.perf_counter()
        examples = []
        for problem, group in zip(problems, groups, strict=True):
            rewards = np.array([exact_match_reward(g.text, problem.answer) for g in group])
            if is_zero_variance(rewards):
                dropped += 1
                continue
            kept += 1
            for generation, advantage in zip(group, grpo_advantages(rewards), strict=True):
                examples.append(
                    PolicyExample(
                        generation.prompt_ids,
                        generation.response_ids,
                        generation.logprobs,
                        np.ones(len(generation.response_ids), np.uint8),
                        float(advantage),
                    )
                )
        if examples:
            trainer.step(examples)
        engine.version = trainer.version
        step += 1
        ended = time.perf_counter()
        sample_s += sampled - started
        train_s += ended - sampled
        clock += ended - started
        step_seconds.append(ended - started)
        cpu += time.process_time() - cpu_started
        if step % args.eval_every == 0:
            em = evaluate_exact_match(model, tokenizer, heldout)
            curve.append(
                {
                    "step": step,
                    "seconds": round(clock, 2),
                    "cpu_seconds": round(cpu, 2),
                    "heldout_em": em,
                    "kept_groups": kept,
                    "dropped_groups": dropped,
                }
            )
            print(f"  {name} step {step:4d}  {clock:6.1f}s  EM {em:.3f}  kept {kept} dropped {dropped}")
    return {
        "name": name,
        "config": asdict(config),
        "reached": em >= args.target,
        "loadavg_1min_at_end": os.getloadavg()[0],
        "seconds_to_target": clock if em >= args.target else None,
        "steps": step,
        "sample_seconds": sample_s,
        "train_seconds": train_s,
        "cpu_seconds": cpu,
        "step_seconds_median": float(np.median(step_seconds)),
        "step_seconds_p10": float(np.percentile(step_seconds, 10)),
        "kept_groups": kept,
        "dropped_groups": dropped,
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--warmup-target", type=float, default=0.30)
    parser.add_argument("--warmup-lr", type=float, default=1e-3)
    parser.add_argument("--warmup-batch", type=int, default=64)
    parser.add_argument("--warmup-max-steps", type=int, default=5000)
    parser.add_argument("--warmup-eval-every", type=int, default=10)
    parser.add_argument(
        "--base",
        type=Path,
        default=Path(tempfile.gettempdir()) / "astraflow_prototype_grpo_base",
        help="where the warm-up checkpoint is saved (or loaded with --reuse-base)",
    )
    parser.add_argument("--reuse-base", action="store_true", help="skip the warm-up, load --base")
    parser.add_argument("--variants", default="tuned", help="comma-separated names, or 'all'")
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS / "prototype_grpo.json")
    args = parser.parse_args()
    record = begin()  # no config file: the variants are in this script, the rest in the command

    torch.set_num_threads(args.threads)
    train, heldout = addition_problems(seed=args.seed, heldout_size=500)
    warmup = None
    if args.reuse_base:
        base = args.base
    else:
        base, warmup = warm_up(args, train, heldout)
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    runs = [run_grpo(name, VARIANTS[name], base, train, heldout, args) for name in names]
    for run in runs:
        print(
            f"{run['name']}: {'reached' if run['reached'] else 'missed'} {args.target} "
            f"in {run['steps']} steps, {run['seconds_to_target'] or float('nan'):.1f}s RL"
        )
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
            "loadavg_at_end": os.getloadavg(),
        },
        "args": {k: str(v) for k, v in vars(args).items()},
        "warmup": warmup,
        "runs": runs,
        "provenance": finish(record),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    plot(report, args.output.with_suffix(".png"), args.target)
    print(f"wrote {args.output} and its .png")


def plot(report: dict, path: Path, target: float) -> None:
    """Held-out EM against RL wall time (warm-up left out) and against RL steps, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in report["runs"]:
        curve = run["curve"]
        by_time.plot([p["seconds"] for p in curve], [p["heldout_em"] for p in curve], label=run["name"])
        by_step.plot([p["step"] for p in curve], [p["heldout_em"] for p in curve], label=run["name"])
    for axis, label in ((by_time, "RL wall seconds (evaluation excluded)"), (by_step, "RL steps")):
        axis.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        axis.set_xlabel(label)
        axis.set_ylabel("held-out greedy exact match")
        axis.grid(alpha=0.3)
    by_step.legend()
    figure.suptitle("GRPO on 2-digit addition, tiny Llama, single process, 2 CPU threads")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
